//! A key-value bucket whose values nodes sign ([`super::seal`]): what
//! this node writes is signed for its bucket and key, and what it reads is
//! checked. A value a node did not sign (written by a holder of NATS
//! credentials without the cluster secret, or moved from another key)
//! reads as no value: [`Signed::entry`] answers it as removed at its
//! revision, so a compare-and-set over it replaces it, [`Signed::create`]
//! writes over it, and a watch skips it.

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::seal::Seal;

/// A bucket of signed values; cheap to clone.
#[derive(Clone)]
pub(crate) struct Signed {
    store: kv::Store,
    bucket: &'static str,
    seal: Seal,
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signed")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

/// A value as read: a node's, or one no node signed (at its revision).
#[derive(Debug)]
pub(crate) enum Checked {
    Genuine(kv::Entry),
    Forged { revision: u64 },
}

impl Signed {
    pub(crate) fn new(store: kv::Store, bucket: &'static str, seal: Seal) -> Self {
        Signed {
            store,
            bucket,
            seal,
        }
    }

    /// The bucket as NATS holds it (for reads of its stream, deletes and keys).
    pub(crate) fn raw(&self) -> &kv::Store {
        &self.store
    }

    fn sealed(&self, key: &str, value: &[u8]) -> Bytes {
        self.seal.seal_value(self.bucket, key, value)
    }

    /// `entry` checked: its value's payload, or forged.
    pub(crate) fn check(&self, entry: kv::Entry) -> Checked {
        match self.seal.open_entry(self.bucket, entry) {
            Ok(entry) => Checked::Genuine(entry),
            Err(entry) => Checked::Forged {
                revision: entry.revision,
            },
        }
    }

    /// The payload of `value`, read raw from under `key`, if a node signed it.
    pub(crate) fn open_value(&self, key: &str, value: &Bytes) -> Option<Bytes> {
        let what = || format!("a value of {} under {key:?}", self.bucket);
        self.seal
            .open(
                &[b"kv", self.bucket.as_bytes(), key.as_bytes()],
                value,
                super::seal::Fresh::Any,
                what,
            )
            .ok()
            .map(|opened| opened.body)
    }

    /// The latest entry of `key`; a forged value answers as removed (at
    /// its revision, with no value).
    pub(crate) async fn entry(
        &self,
        key: impl AsRef<str>,
    ) -> Result<Option<kv::Entry>, kv::EntryError> {
        Ok(self
            .store
            .entry(key.as_ref())
            .await?
            .map(|entry| self.opened(entry)))
    }

    /// `entry` with its value's payload when a node signed it; a forged
    /// value as removed (at its revision, with no value).
    fn opened(&self, entry: kv::Entry) -> kv::Entry {
        match self.seal.open_entry(self.bucket, entry) {
            Ok(entry) => entry,
            Err(entry) => kv::Entry {
                value: Bytes::new(),
                operation: Operation::Delete,
                ..*entry
            },
        }
    }

    /// [`Signed::entry`] as the stream's leader holds it: a direct get
    /// (what `entry` does) may be answered by any replica, one of which
    /// can lag behind the others, so two reads in a row may go back in
    /// time. For judging whether a record still changes.
    pub(crate) async fn latest(
        &self,
        key: impl AsRef<str>,
    ) -> Result<Option<kv::Entry>, kv::EntryError> {
        Ok(self.latest_raw(key).await?.map(|entry| self.opened(entry)))
    }

    /// [`Signed::latest`] unchecked: the entry as the leader holds it.
    pub(crate) async fn latest_raw(
        &self,
        key: impl AsRef<str>,
    ) -> Result<Option<kv::Entry>, kv::EntryError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let key = key.as_ref();
        let subject = format!("{}{key}", self.store.prefix);
        let message = match self
            .store
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(message) => message,
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(err) => return Err(kv::EntryError::with_source(kv::EntryErrorKind::Other, err)),
        };
        let operation = match message
            .headers
            .get("KV-Operation")
            .map(|value| value.as_str())
        {
            Some("DEL") => Operation::Delete,
            Some("PURGE") => Operation::Purge,
            _ => Operation::Put,
        };
        Ok(Some(kv::Entry {
            bucket: self.store.name.clone(),
            key: key.to_owned(),
            value: message.payload,
            revision: message.sequence,
            delta: 0,
            created: message.time,
            operation,
            seen_current: false,
        }))
    }

    /// The value of `key`, if a node wrote it.
    pub(crate) async fn get(&self, key: impl AsRef<str>) -> Result<Option<Bytes>, kv::EntryError> {
        Ok(self
            .entry(key)
            .await?
            .filter(|entry| entry.operation == Operation::Put)
            .map(|entry| entry.value))
    }

    /// Writes `value` under `key` when it holds none (a forged one counts
    /// as none); answers the revision.
    pub(crate) async fn create(
        &self,
        key: impl AsRef<str>,
        value: impl AsRef<[u8]>,
    ) -> Result<u64, kv::CreateError> {
        let key = key.as_ref();
        let sealed = self.sealed(key, value.as_ref());
        match self.store.create(key, sealed.clone()).await {
            Err(err) if err.kind() == CreateErrorKind::AlreadyExists => {
                // Over a forged value, at its revision: a node writing
                // meanwhile wins, and this create fails as it would have.
                if let Ok(Some(entry)) = self.store.entry(key).await
                    && let Checked::Forged { revision } = self.check(entry)
                    && let Ok(written) = self.store.update(key, sealed, revision).await
                {
                    return Ok(written);
                }
                Err(err)
            }
            other => other,
        }
    }

    /// Writes `value` under `key`.
    pub(crate) async fn put(
        &self,
        key: impl AsRef<str>,
        value: impl AsRef<[u8]>,
    ) -> Result<u64, kv::PutError> {
        let key = key.as_ref();
        self.store.put(key, self.sealed(key, value.as_ref())).await
    }

    /// Writes `value` under `key` if it is still at `revision`.
    pub(crate) async fn update(
        &self,
        key: impl AsRef<str>,
        value: impl AsRef<[u8]>,
        revision: u64,
    ) -> Result<u64, kv::UpdateError> {
        let key = key.as_ref();
        self.store
            .update(key, self.sealed(key, value.as_ref()), revision)
            .await
    }

    /// Removes `key`. A removal carries no signature (NATS keeps no value
    /// for it): see docs/CLUSTER.md, "Signed messages".
    pub(crate) async fn delete(&self, key: impl AsRef<str>) -> Result<(), kv::DeleteError> {
        self.store.delete(key).await
    }

    /// Removes `key` if it is still at `revision` (see [`Signed::delete`]).
    pub(crate) async fn delete_expect_revision(
        &self,
        key: impl AsRef<str>,
        revision: Option<u64>,
    ) -> Result<(), kv::DeleteError> {
        self.store.delete_expect_revision(key, revision).await
    }

    /// Every change from the bucket's history on, each value checked:
    /// forged ones are left out (said in the log), but for the last of
    /// the history, which comes as the removal of an empty key so that
    /// the watcher knows it has caught up.
    pub(crate) async fn watch_with_history(
        &self,
        keys: &str,
    ) -> Result<BoxStream<'static, Result<kv::Entry, kv::WatcherError>>, kv::WatchError> {
        let watch = self.store.watch_with_history(keys).await?;
        let (seal, bucket) = (self.seal.clone(), self.bucket);
        let mut caught_up = false;
        Ok(watch
            .filter_map(move |change| {
                let kept = match change {
                    Ok(entry) => {
                        let last_of_history = !caught_up && entry.delta == 0;
                        caught_up |= entry.delta == 0;
                        match seal.open_entry(bucket, entry) {
                            Ok(entry) => Some(Ok(entry)),
                            // The last of the history still tells the watcher
                            // it has caught up: passed on as the removal of no key.
                            Err(entry) if last_of_history => Some(Ok(kv::Entry {
                                key: String::new(),
                                value: Bytes::new(),
                                operation: Operation::Delete,
                                ..*entry
                            })),
                            Err(_) => None,
                        }
                    }
                    Err(err) => Some(Err(err)),
                };
                std::future::ready(kept)
            })
            .boxed())
    }
}
