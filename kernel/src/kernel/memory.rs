//! Agent memory: short texts a process remembers in a namespace of its own
//! (keyed by its PID, so a config agent, which comes back with its PID after
//! a restart, finds its memory again) and recalls by full-text search.
//!
//! Recall runs an FTS5 query over the text and tags of the caller's entries,
//! ranked by bm25 (words are stemmed, so `deploying`
//! finds `deploy`). The query is never handed to FTS5 as written: it is cut
//! into words (letters and digits), each word becomes a quoted FTS5 string,
//! and the strings are joined with `OR`, so no input can be an FTS5 operator
//! (`NEAR`, `*`, `-`, `:`, parentheses, quotes) or a syntax error, and an
//! entry matching more of the words ranks higher. A query with no words
//! lists the newest entries instead.
//!
//! The admin's namespace is PID 1's. An entry stays until its key is
//! forgotten or its process is reaped (a config agent's stays for when it
//! comes back: nobody else could ever recall it).

use std::time::SystemTime;

use hivekernel_agents::{MemoryEntry, MemoryHit, NewMemory};

pub use crate::config::MemorySettings;
use crate::error::{KernelError, Result};
use crate::events::unix_ms;
use crate::kernel::{Caller, Kernel};
use crate::store::{Applied, MemoryWrite, Write};

/// Longest memory key, in bytes.
pub const MAX_MEMORY_KEY_BYTES: usize = 128;
/// Most tags on one entry.
pub const MAX_MEMORY_TAGS: usize = 16;
/// Longest tag, in bytes.
pub const MAX_MEMORY_TAG_BYTES: usize = 64;
/// Entries a recall returns when it does not say.
pub const DEFAULT_RECALL_LIMIT: usize = 5;
/// Words of a recall query that are searched for; the rest are ignored.
pub const MAX_QUERY_WORDS: usize = 32;
/// Longest word searched for, in characters; longer ones are cut.
const MAX_WORD_CHARS: usize = 64;

/// Memory through the kernel ([`Kernel::memory`]): storing, forgetting and
/// recalling notes as the caller may.
#[derive(Debug, Clone, Copy)]
pub struct MemoryHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's memory.
    pub fn memory(&self) -> MemoryHandle<'_> {
        MemoryHandle { kernel: self }
    }
}

impl MemoryHandle<'_> {
    /// Remembers `entry` in the caller's namespace, replacing the entry
    /// with the same key; returns once committed. A refused store changes nothing.
    pub async fn store(self, caller: Caller, entry: NewMemory) -> Result<MemoryEntry> {
        let NewMemory { text, key, tags } = entry;
        if text.trim().is_empty() || text.contains('\0') {
            return Err(KernelError::InvalidArgument(
                "memory text must not be empty and must not contain NUL characters".into(),
            ));
        }
        let key = key.filter(|k| !k.is_empty());
        if let Some(key) = &key {
            check_key(key)?;
        }
        let tags = check_tags(tags)?;
        let joined = tags.join(" ");
        let size = (text.len() + key.as_ref().map_or(0, String::len) + joined.len()) as u64;
        let limits = self.kernel.inner.settings().memory;
        if size > limits.max_entry_bytes {
            return Err(KernelError::LimitExceeded(format!(
                "memory entry is {size} bytes, over kernel.memory.max_entry_bytes ({} bytes)",
                limits.max_entry_bytes
            )));
        }
        let store = self.kernel.durable_store("memory")?;
        let pid = caller.pid();
        let line = crate::store::lineage(&self.kernel.lineage_of(pid));
        let at_ms = unix_ms(SystemTime::now());
        let id = self.kernel.next_id();
        let write = MemoryWrite {
            id,
            pid,
            quota: self.kernel.storage_quota(&line),
            lineage: line,
            key: key.clone(),
            text: text.clone(),
            tags: joined,
            size,
            at_ms,
            max_bytes: limits.max_bytes_per_agent,
        };
        let (id, created_ms) = match store.commit_applied(Write::Memory(Box::new(write))).await? {
            Applied::Stored { id, created_ms } => (id, created_ms),
            Applied::Done | Applied::Absent => (id, at_ms),
            Applied::Refused(why) => return Err(KernelError::LimitExceeded(why)),
        };
        Ok(MemoryEntry {
            id,
            key,
            text,
            tags,
            created_at_unix_ms: created_ms,
            updated_at_unix_ms: at_ms,
        })
    }

    /// Deletes the caller's entry under `key`; returns once committed.
    pub async fn forget(self, caller: Caller, key: &str) -> Result<()> {
        if key.is_empty() {
            return Err(KernelError::InvalidArgument(
                "memory key must not be empty".into(),
            ));
        }
        check_key(key)?;
        let store = self.kernel.durable_store("memory")?;
        let write = Write::MemoryForget {
            pid: caller.pid(),
            key: key.to_owned(),
        };
        match store.commit_applied(write).await? {
            Applied::Absent => Err(KernelError::NoSuchMemory(key.to_owned())),
            Applied::Refused(why) => Err(KernelError::FailedPrecondition(why)),
            Applied::Done | Applied::Stored { .. } => Ok(()),
        }
    }

    /// The caller's entries that best match `query`, best first, at most
    /// `limit` ([`DEFAULT_RECALL_LIMIT`] when `None`, never more than
    /// `kernel.memory.max_results`); the newest entries when `query` has no words.
    pub async fn recall(
        self,
        caller: Caller,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryHit>> {
        let most = self.kernel.inner.settings().memory.max_results as usize;
        let limit = match limit {
            Some(0) => {
                return Err(KernelError::InvalidArgument(
                    "recall limit must be at least 1".into(),
                ));
            }
            Some(n) => n.min(most),
            None => DEFAULT_RECALL_LIMIT.min(most),
        };
        let store = self.kernel.durable_store("memory")?;
        Ok(store.recall(caller.pid(), fts_query(query), limit).await?)
    }
}

/// A key: at most [`MAX_MEMORY_KEY_BYTES`] bytes without control characters.
fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_MEMORY_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(KernelError::InvalidArgument(format!(
            "memory key must be at most {MAX_MEMORY_KEY_BYTES} bytes without control \
             characters, got {}",
            crate::error::shown(key)
        )));
    }
    Ok(())
}

/// Tags: at most [`MAX_MEMORY_TAGS`], each 1 to [`MAX_MEMORY_TAG_BYTES`]
/// bytes without whitespace or control characters; duplicates dropped.
fn check_tags(tags: Vec<String>) -> Result<Vec<String>> {
    let mut kept: Vec<String> = Vec::with_capacity(tags.len());
    for tag in tags {
        let bad = tag.is_empty()
            || tag.len() > MAX_MEMORY_TAG_BYTES
            || tag.chars().any(|c| c.is_whitespace() || c.is_control());
        if bad {
            return Err(KernelError::InvalidArgument(format!(
                "memory tag must be 1 to {MAX_MEMORY_TAG_BYTES} bytes without spaces or control \
                 characters, got {}",
                crate::error::shown(&tag)
            )));
        }
        if !kept.contains(&tag) {
            kept.push(tag);
        }
    }
    if kept.len() > MAX_MEMORY_TAGS {
        return Err(KernelError::InvalidArgument(format!(
            "a memory entry may have at most {MAX_MEMORY_TAGS} tags, got {}",
            kept.len()
        )));
    }
    Ok(kept)
}

/// The FTS5 expression for a user's query: its words, each a quoted
/// string, joined with `OR`; `None` when it has no words.
pub(crate) fn fts_query(text: &str) -> Option<String> {
    // Combining marks stay inside a word, as FTS5's unicode61 tokenizer keeps them.
    let in_word = |c: char| c.is_alphanumeric() || ('\u{300}'..='\u{36f}').contains(&c);
    let mut words: Vec<String> = Vec::new();
    for word in text.split(|c: char| !in_word(c)).filter(|w| !w.is_empty()) {
        // FTS5 folds case anyway; folding here drops duplicates.
        let word: String = word
            .chars()
            .take(MAX_WORD_CHARS)
            .collect::<String>()
            .to_lowercase();
        if !words.contains(&word) {
            words.push(word);
        }
        if words.len() == MAX_QUERY_WORDS {
            break;
        }
    }
    if words.is_empty() {
        return None;
    }
    // A word holds only letters, digits and marks, so it needs no escaping inside quotes.
    let quoted: Vec<String> = words.iter().map(|w| format!("\"{w}\"")).collect();
    Some(quoted.join(" OR "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_become_quoted_words_joined_with_or() {
        assert_eq!(
            fts_query("deploy plan").as_deref(),
            Some("\"deploy\" OR \"plan\"")
        );
        assert_eq!(
            fts_query("NEAR(a b) -c* \"d\" e:f").as_deref(),
            Some("\"near\" OR \"a\" OR \"b\" OR \"c\" OR \"d\" OR \"e\" OR \"f\"")
        );
        assert_eq!(fts_query("café").as_deref(), Some("\"café\""));
        for empty in ["", "   ", "*", "\"\"", "()", "-", "\0", "-- ; DROP"] {
            let got = fts_query(empty);
            assert!(
                got.is_none() || empty.contains("DROP"),
                "{empty:?} -> {got:?}"
            );
        }
        let many = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let query = fts_query(&many).unwrap_or_default();
        assert_eq!(query.matches(" OR ").count(), MAX_QUERY_WORDS - 1);
        assert_eq!(fts_query("a a A").as_deref(), Some("\"a\""));
    }

    #[test]
    fn tags_are_checked_and_deduplicated() {
        let tags = |t: &[&str]| check_tags(t.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            tags(&["x", "y", "x"]).ok(),
            Some(vec!["x".into(), "y".into()])
        );
        assert!(tags(&["two words"]).is_err());
        assert!(tags(&[""]).is_err());
        let many: Vec<String> = (0..=MAX_MEMORY_TAGS).map(|i| i.to_string()).collect();
        assert!(check_tags(many).is_err());
    }
}
