//! Artifacts as a process sees them: named blobs the kernel keeps in its
//! store, owned by the process that stored them, with a visibility that
//! decides who else may read them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::named::named_enum;
use crate::process::Pid;

/// Kernel-wide unique artifact id; never reused, across restarts too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArtifactId(pub u64);

impl fmt::Display for ArtifactId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

named_enum!(
    /// Who besides its owner may read an artifact; `user` unless given.
    #[derive(Default)]
    Visibility, "visibility" {
        /// The owner only (the operator sees that it exists and may delete it, not its content).
        Private = "private",
        /// The owner and the operator (the admin).
        #[default]
        User = "user",
        /// The owner, its ancestors and its descendants (and so the operator).
        Subtree = "subtree",
        /// Every process.
        Global = "global",
    }
);

/// What the kernel knows about an artifact, without its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactInfo {
    /// Its id.
    pub id: ArtifactId,
    /// Its name, unique per owner.
    pub name: String,
    /// The process that stored it.
    pub owner: Pid,
    /// The owner's name when it stored it.
    pub owner_name: String,
    /// MIME type, e.g. `text/plain`.
    pub content_type: String,
    /// Who may read it.
    pub visibility: Visibility,
    /// Content length in bytes.
    pub size: u64,
    /// When it was first stored, Unix milliseconds.
    pub created_at_unix_ms: u64,
    /// When its content was last replaced, Unix milliseconds.
    pub updated_at_unix_ms: u64,
}

/// An artifact with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Its description.
    pub info: ArtifactInfo,
    /// Its bytes.
    pub content: Vec<u8>,
}

/// An artifact to store; storing a name the owner already has replaces that artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewArtifact {
    /// Its name.
    pub name: String,
    /// MIME type; `None` means `text/plain`.
    pub content_type: Option<String>,
    /// Who may read it; `None` means [`Visibility::User`].
    pub visibility: Option<Visibility>,
    /// Its bytes.
    pub content: Vec<u8>,
}

impl NewArtifact {
    /// A `text/plain` artifact with the default visibility.
    pub fn text(name: impl Into<String>, content: impl Into<String>) -> Self {
        NewArtifact {
            name: name.into(),
            content_type: None,
            visibility: None,
            content: content.into().into_bytes(),
        }
    }
}
