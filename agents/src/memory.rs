//! Agent memory as a process sees it: short texts kept in the kernel's
//! store in a namespace of the process's own, found again by full-text search.

use serde::{Deserialize, Serialize};

/// One remembered entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEntry {
    /// Its id, unique in the kernel.
    pub id: u64,
    /// Its key, when it was stored under one (storing the key again replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What was remembered.
    pub text: String,
    /// Labels it was stored with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// When it was first stored, Unix milliseconds.
    pub created_at_unix_ms: u64,
    /// When it was last replaced, Unix milliseconds.
    pub updated_at_unix_ms: u64,
}

/// An entry found by a recall, with how well it matched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryHit {
    /// The entry.
    #[serde(flatten)]
    pub entry: MemoryEntry,
    /// Relevance, higher is better (the negated bm25 rank); 0 when the
    /// recall had no words to search for and listed recent entries instead.
    pub score: f64,
}

/// Something to remember.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewMemory {
    /// The text.
    pub text: String,
    /// Optional key: storing a key the namespace already has replaces that entry.
    pub key: Option<String>,
    /// Optional labels, searched along with the text.
    pub tags: Vec<String>,
}
