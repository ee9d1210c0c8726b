//! Signatures on what nodes publish (docs/CLUSTER.md, "Signed messages").
//!
//! With `kernel.cluster.secret_file`, every operation between nodes and
//! its answer, every mail, every event and every value of the buckets
//! nodes rely on goes out as a header line, then the payload:
//!
//! ```text
//! hk1 <node> <unix ms> <nonce> <HMAC-SHA256, hex>\n<payload>
//! ```
//!
//! The HMAC, keyed with the cluster's secret, covers where the payload
//! goes (its context: the operation's node, the answer's request, the
//! stream subject and message id, the bucket and key), the sender's node
//! name, the time, the nonce and the payload. A receiver drops, and logs,
//! what is unsigned, badly signed, or (for what is delivered as it is
//! sent: operations and answers, mail and events as stored) more than
//! [`WINDOW_MS`] away from its clock or its storing; an operation seen
//! already within the window is a replay. A bucket value is state: it
//! stays valid however old it is, and is bound to its bucket and key.
//!
//! Without a secret, nothing is signed and everything is taken as it
//! comes (a start says what that means).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::kv;
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

use crate::event::unix_ms;

/// How far a message's time may be from the receiver's clock, or from
/// when the stream stored it.
pub(crate) const WINDOW_MS: u64 = 30_000;
/// Most operations remembered as seen: past it the oldest are forgotten,
/// and anything signed no later than they were refused (too old to tell).
const REMEMBERED: usize = 1 << 17;
/// How long an operation is remembered: one within the window either way
/// of the receiver's clock is accepted for at most this long.
const REMEMBER_FOR: Duration = Duration::from_millis(2 * WINDOW_MS);
/// What every signed payload starts with.
const MAGIC: &[u8] = b"hk1 ";
/// The longest header line: the magic, a node name (64), a time, a nonce,
/// a MAC, and their separators.
const MAX_HEADER: usize = 4 + 64 + 1 + 20 + 1 + 16 + 1 + 64 + 1;
/// The least time between two warnings about refused messages.
const WARN_EVERY: Duration = Duration::from_secs(1);

type HmacSha256 = Hmac<Sha256>;

/// Why a signed message or value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Forged {
    /// It carries no signature.
    Unsigned,
    /// Its header cannot be read.
    Malformed,
    /// Its HMAC is not the cluster secret's over what it carries.
    BadMac,
    /// Signed by one node, it claims to come from another.
    WrongNode { claimed: String, signer: String },
    /// Its time is this far off (ms; positive: ahead).
    Stale { off_ms: i64 },
    /// Seen already within the window.
    Replayed,
}

impl std::fmt::Display for Forged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forged::Unsigned => f.write_str("not signed with the cluster secret"),
            Forged::Malformed => f.write_str("its signature cannot be read"),
            Forged::BadMac => f.write_str("its signature does not match (not the cluster secret)"),
            Forged::WrongNode { claimed, signer } => {
                write!(
                    f,
                    "signed by node {signer:?} but claims to come from {claimed:?}"
                )
            }
            Forged::Stale { off_ms } => write!(
                f,
                "its time is {off_ms} ms off, more than the {WINDOW_MS} ms allowed"
            ),
            Forged::Replayed => f.write_str("a replay of one seen already"),
        }
    }
}

/// When a message must have been signed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fresh {
    /// Within the window of now, and not seen before (an operation, an answer).
    Now,
    /// Within the window of when the stream stored it (Unix ms).
    Stored(u64),
    /// Any time: a bucket value.
    Any,
}

/// What a signed message says, once checked.
#[derive(Debug, Clone)]
pub(crate) struct Opened {
    /// The signing node; empty in a cluster without a secret.
    pub(crate) node: String,
    /// The payload.
    pub(crate) body: Bytes,
    /// Its MAC: what an answer is bound to.
    pub(crate) mac: [u8; 32],
}

/// Signs what this node publishes and checks what others did; cheap to clone.
#[derive(Clone)]
pub(crate) struct Seal {
    node: Arc<str>,
    keyed: Option<Arc<Keyed>>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("node", &self.node)
            .field("signed", &self.keyed.is_some())
            .finish()
    }
}

struct Keyed {
    /// The HMAC keyed with the secret, cloned for every message.
    mac: HmacSha256,
    nonce: AtomicU64,
    seen: Mutex<Seen>,
    refused: AtomicU64,
    warned: Mutex<(Option<Instant>, u64)>,
}

/// Operations seen within the window, oldest first.
#[derive(Default)]
struct Seen {
    macs: HashMap<[u8; 32], ()>,
    order: VecDeque<([u8; 32], u64, Instant)>,
    /// Messages signed at or before this (Unix ms) are refused: some of
    /// that time were forgotten before their window closed.
    floor_ms: u64,
}

impl Seen {
    /// Notes `mac`, signed at `at_ms`; false when it was seen already or
    /// is older than what is remembered.
    fn first(&mut self, mac: [u8; 32], at_ms: u64, now: Instant) -> bool {
        while let Some((old, _, seen)) = self.order.front() {
            if now.saturating_duration_since(*seen) < REMEMBER_FOR {
                break;
            }
            self.macs.remove(old);
            self.order.pop_front();
        }
        if at_ms <= self.floor_ms || self.macs.contains_key(&mac) {
            return false;
        }
        if self.order.len() >= REMEMBERED
            && let Some((old, old_at, _)) = self.order.pop_front()
        {
            self.macs.remove(&old);
            self.floor_ms = self.floor_ms.max(old_at);
        }
        self.macs.insert(mac, ());
        self.order.push_back((mac, at_ms, now));
        true
    }
}

impl Seal {
    /// A seal for node `node`: signing with `secret`, or, without one,
    /// neither signing nor checking.
    pub(crate) fn new(node: &str, secret: Option<&[u8]>) -> Self {
        let keyed = secret.and_then(|secret| {
            let mac = HmacSha256::new_from_slice(secret).ok()?;
            let mut start = [0u8; 8];
            // A nonce only has to differ between this node's messages in
            // the same millisecond; a random start keeps restarts apart.
            let _ = getrandom::fill(&mut start);
            Some(Arc::new(Keyed {
                mac,
                nonce: AtomicU64::new(u64::from_le_bytes(start)),
                seen: Mutex::new(Seen::default()),
                refused: AtomicU64::new(0),
                warned: Mutex::new((None, 0)),
            }))
        });
        Seal {
            node: Arc::from(node),
            keyed,
        }
    }

    /// Whether this node signs (it has the cluster secret).
    pub(crate) fn signs(&self) -> bool {
        self.keyed.is_some()
    }

    /// `payload` signed for `context`, as this node, now.
    pub(crate) fn seal(&self, context: &[&[u8]], payload: &[u8]) -> Bytes {
        self.seal_at(context, payload, unix_ms(SystemTime::now())).0
    }

    /// [`Seal::seal`], with the MAC (all zeros without a secret): what
    /// the answer to an operation is bound to.
    pub(crate) fn seal_op(&self, context: &[&[u8]], payload: &[u8]) -> (Bytes, [u8; 32]) {
        self.seal_at(context, payload, unix_ms(SystemTime::now()))
    }

    fn seal_at(&self, context: &[&[u8]], payload: &[u8], at_ms: u64) -> (Bytes, [u8; 32]) {
        let Some(keyed) = &self.keyed else {
            return (Bytes::copy_from_slice(payload), [0; 32]);
        };
        let nonce = keyed.nonce.fetch_add(1, Ordering::Relaxed);
        let mac = keyed.compute(context, &self.node, at_ms, nonce, payload);
        let mut out = Vec::with_capacity(MAX_HEADER + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(self.node.as_bytes());
        out.extend_from_slice(format!(" {at_ms} {nonce:016x} ").as_bytes());
        out.extend_from_slice(hex(&mac).as_bytes());
        out.push(b'\n');
        out.extend_from_slice(payload);
        (Bytes::from(out), mac)
    }

    /// The payload of `signed` if it was signed for `context` with the
    /// cluster secret, at a time `fresh` accepts; without a secret,
    /// `signed` as it is. What is refused is counted and logged here,
    /// `what` naming it (made only then).
    pub(crate) fn open(
        &self,
        context: &[&[u8]],
        signed: &Bytes,
        fresh: Fresh,
        what: impl FnOnce() -> String,
    ) -> Result<Opened, Forged> {
        let opened = self.check(context, signed, fresh, SystemTime::now());
        if let Err(why) = &opened {
            self.refused(&what(), why);
        }
        opened
    }

    fn check(
        &self,
        context: &[&[u8]],
        signed: &Bytes,
        fresh: Fresh,
        now: SystemTime,
    ) -> Result<Opened, Forged> {
        let Some(keyed) = &self.keyed else {
            return Ok(Opened {
                node: String::new(),
                body: signed.clone(),
                mac: [0; 32],
            });
        };
        if !signed.starts_with(MAGIC) {
            return Err(Forged::Unsigned);
        }
        let end = signed
            .iter()
            .take(MAX_HEADER)
            .position(|&b| b == b'\n')
            .ok_or(Forged::Malformed)?;
        let header =
            std::str::from_utf8(&signed[MAGIC.len()..end]).map_err(|_| Forged::Malformed)?;
        let mut fields = header.split(' ');
        let (Some(node), Some(at), Some(nonce), Some(mac), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(Forged::Malformed);
        };
        let at_ms: u64 = at.parse().map_err(|_| Forged::Malformed)?;
        let nonce = u64::from_str_radix(nonce, 16).map_err(|_| Forged::Malformed)?;
        let tag = unhex(mac).ok_or(Forged::Malformed)?;
        let body = signed.slice(end + 1..);
        let mut check = keyed.start(context, node, at_ms, nonce);
        check.update(&body);
        // Constant time: the crate's own comparison.
        check.verify_slice(&tag).map_err(|_| Forged::BadMac)?;
        let off = |then: u64| {
            i64::try_from(at_ms).unwrap_or(i64::MAX) - i64::try_from(then).unwrap_or(i64::MAX)
        };
        match fresh {
            Fresh::Any => {}
            Fresh::Stored(stored_ms) => {
                let off_ms = off(stored_ms);
                if off_ms.unsigned_abs() > WINDOW_MS {
                    return Err(Forged::Stale { off_ms });
                }
            }
            Fresh::Now => {
                let now_ms = unix_ms(now);
                let off_ms = off(now_ms);
                if off_ms.unsigned_abs() > WINDOW_MS {
                    return Err(Forged::Stale { off_ms });
                }
                if !keyed.seen.lock().first(tag, at_ms, Instant::now()) {
                    return Err(Forged::Replayed);
                }
            }
        }
        Ok(Opened {
            node: node.to_owned(),
            body,
            mac: tag,
        })
    }

    /// Counts and logs a refused message (`what`, and why): a warning at
    /// most every second, saying how many more were refused meanwhile.
    pub(crate) fn refused(&self, what: &str, why: &Forged) {
        let Some(keyed) = &self.keyed else { return };
        keyed.refused.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let quiet = {
            let mut warned = keyed.warned.lock();
            match warned.0 {
                Some(last) if now.saturating_duration_since(last) < WARN_EVERY => {
                    warned.1 += 1;
                    None
                }
                _ => {
                    warned.0 = Some(now);
                    Some(std::mem::take(&mut warned.1))
                }
            }
        };
        if let Some(also) = quiet {
            tracing::warn!(
                node = %self.node,
                refused_before = also,
                "cluster: refused {what}: {why} (NATS credentials without the cluster secret, \
                 or a node with another secret_file)"
            );
        }
    }

    /// How many messages and values were refused so far.
    pub(crate) fn refused_count(&self) -> u64 {
        self.keyed
            .as_ref()
            .map_or(0, |keyed| keyed.refused.load(Ordering::Relaxed))
    }

    /// The context a value of `bucket` under `key` is signed for.
    fn kv_context<'a>(bucket: &'a str, key: &'a str) -> [&'a [u8]; 3] {
        [b"kv", bucket.as_bytes(), key.as_bytes()]
    }

    /// `value`, to be written under `key` of `bucket`, signed.
    pub(crate) fn seal_value(&self, bucket: &str, key: &str, value: &[u8]) -> Bytes {
        self.seal(&Self::kv_context(bucket, key), value)
    }

    /// `entry` of `bucket` with its value's payload when it is a genuine
    /// node's (or anything but a value: a delete, a purge); else the
    /// entry as read (refused: counted and logged here).
    pub(crate) fn open_entry(
        &self,
        bucket: &str,
        entry: kv::Entry,
    ) -> Result<kv::Entry, Box<kv::Entry>> {
        if entry.operation != kv::Operation::Put || self.keyed.is_none() {
            return Ok(entry);
        }
        let what = || format!("a value of {bucket} under {:?}", entry.key);
        match self.open(
            &Self::kv_context(bucket, &entry.key),
            &entry.value,
            Fresh::Any,
            what,
        ) {
            Ok(opened) => Ok(kv::Entry {
                value: opened.body,
                ..entry
            }),
            Err(_) => Err(Box::new(entry)),
        }
    }
}

impl Keyed {
    /// The MAC so far over the context, the signer, the time and the nonce.
    fn start(&self, context: &[&[u8]], node: &str, at_ms: u64, nonce: u64) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(&(context.len() as u64).to_be_bytes());
        for part in context.iter().chain([&node.as_bytes()]) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(&at_ms.to_be_bytes());
        mac.update(&nonce.to_be_bytes());
        mac
    }

    fn compute(
        &self,
        context: &[&[u8]],
        node: &str,
        at_ms: u64,
        nonce: u64,
        payload: &[u8],
    ) -> [u8; 32] {
        let mut mac = self.start(context, node, at_ms, nonce);
        mac.update(payload);
        mac.finalize().into_bytes().into()
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).ok()?;
        *out.get_mut(i)? = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// 32 random bytes, hex, as a cluster secret file holds them.
pub fn new_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|err| format!("no random bytes from the system: {err}"))?;
    Ok(hex(&bytes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn op() -> String {
        "an operation".into()
    }

    #[test]
    fn a_sealed_message_opens_with_the_same_secret_and_context() {
        let a = Seal::new("a", Some(SECRET));
        let b = Seal::new("b", Some(SECRET));
        let sealed = a.seal(&[b"rpc", b"b"], b"{\"op\":1}");
        let opened = b.open(&[b"rpc", b"b"], &sealed, Fresh::Now, op).unwrap();
        assert_eq!(opened.node, "a");
        assert_eq!(&opened.body[..], b"{\"op\":1}");
        // The same again is a replay.
        assert_eq!(
            b.open(&[b"rpc", b"b"], &sealed, Fresh::Now, op)
                .unwrap_err(),
            Forged::Replayed
        );
        assert_eq!(b.refused_count(), 1);
    }

    #[test]
    fn another_context_secret_or_payload_is_refused() {
        let a = Seal::new("a", Some(SECRET));
        let b = Seal::new("b", Some(SECRET));
        let sealed = a.seal(&[b"rpc", b"b"], b"payload");
        assert_eq!(
            b.open(&[b"rpc", b"c"], &sealed, Fresh::Any, op)
                .unwrap_err(),
            Forged::BadMac
        );
        let other = Seal::new("x", Some(b"another secret of thirty-two bytes!"));
        assert_eq!(
            other
                .open(&[b"rpc", b"b"], &sealed, Fresh::Any, op)
                .unwrap_err(),
            Forged::BadMac
        );
        let mut changed = sealed.to_vec();
        *changed.last_mut().unwrap() = b'X';
        assert_eq!(
            b.open(&[b"rpc", b"b"], &Bytes::from(changed), Fresh::Any, op)
                .unwrap_err(),
            Forged::BadMac
        );
        // Claiming another signer breaks the MAC too.
        let renamed = Bytes::from(
            String::from_utf8(sealed.to_vec())
                .unwrap()
                .replacen("hk1 a ", "hk1 c ", 1),
        );
        assert_eq!(
            b.open(&[b"rpc", b"b"], &renamed, Fresh::Any, op)
                .unwrap_err(),
            Forged::BadMac
        );
        for junk in [
            &b"payload"[..],
            b"hk1 ",
            b"hk1 a 1 2 3\nx",
            b"hk1 a x 00 00\n",
        ] {
            assert!(
                b.open(&[b"rpc"], &Bytes::copy_from_slice(junk), Fresh::Any, op)
                    .is_err()
            );
        }
    }

    #[test]
    fn an_old_message_is_stale_but_an_old_value_is_not() {
        let a = Seal::new("a", Some(SECRET));
        let long_ago = unix_ms(SystemTime::now()) - 3_600_000;
        let sealed = a
            .seal_at(&[b"kv", b"hk_claims", b"lost.b.1"], b"a", long_ago)
            .0;
        assert!(matches!(
            a.check(
                &[b"kv", b"hk_claims", b"lost.b.1"],
                &sealed,
                Fresh::Now,
                SystemTime::now()
            ),
            Err(Forged::Stale { .. })
        ));
        assert!(matches!(
            a.check(
                &[b"kv", b"hk_claims", b"lost.b.1"],
                &sealed,
                Fresh::Stored(long_ago + 40_000),
                SystemTime::now()
            ),
            Err(Forged::Stale { .. })
        ));
        assert!(
            a.check(
                &[b"kv", b"hk_claims", b"lost.b.1"],
                &sealed,
                Fresh::Stored(long_ago + 1_000),
                SystemTime::now()
            )
            .is_ok()
        );
        assert!(
            a.check(
                &[b"kv", b"hk_claims", b"lost.b.1"],
                &sealed,
                Fresh::Any,
                SystemTime::now()
            )
            .is_ok()
        );
        // Moved to another key, it does not open.
        assert_eq!(
            a.check(
                &[b"kv", b"hk_claims", b"lost.a.1"],
                &sealed,
                Fresh::Any,
                SystemTime::now()
            )
            .unwrap_err(),
            Forged::BadMac
        );
    }

    #[test]
    fn without_a_secret_everything_passes_as_it_is() {
        let open = Seal::new("a", None);
        let sealed = open.seal(&[b"rpc"], b"plain");
        assert_eq!(&sealed[..], b"plain");
        assert_eq!(
            &open.open(&[b"rpc"], &sealed, Fresh::Now, op).unwrap().body[..],
            b"plain"
        );
        // A signed node refuses it.
        let signed = Seal::new("b", Some(SECRET));
        assert_eq!(
            signed.open(&[b"rpc"], &sealed, Fresh::Now, op).unwrap_err(),
            Forged::Unsigned
        );
    }

    #[test]
    fn the_replay_memory_is_bounded_and_forgets_by_raising_a_floor() {
        let mut seen = Seen::default();
        let now = Instant::now();
        for i in 0..(REMEMBERED as u64 + 10) {
            let mut mac = [0u8; 32];
            mac[..8].copy_from_slice(&i.to_be_bytes());
            assert!(seen.first(mac, 1_000 + i, now));
        }
        assert_eq!(seen.order.len(), REMEMBERED);
        assert_eq!(seen.macs.len(), REMEMBERED);
        // The first ten were forgotten: anything signed as early is refused.
        assert!(!seen.first([9; 32], 1_009, now));
        assert!(seen.first([9; 32], 1_000 + REMEMBERED as u64 + 10, now));
        // Past the window, all is forgotten.
        let later = now + REMEMBER_FOR + Duration::from_secs(1);
        assert!(seen.first([7; 32], 2_000_000, later));
        assert_eq!(seen.order.len(), 1);
    }
}
