//! Artifacts: named blobs a process stores in the kernel's store and others
//! read according to its visibility.
//!
//! An artifact belongs to the process that stored it (the admin may store
//! one for any process; its own belong to PID 1). Its name is unique per
//! owner: storing the name again replaces the content, type and visibility
//! and keeps the id. Who may read it:
//!
//! | visibility | processes that may read it | the admin |
//! |---|---|---|
//! | `private` | the owner | lists and deletes it, may not read its content |
//! | `user` (default) | the owner | reads it |
//! | `subtree` | the owner, its ancestors and its descendants | reads it |
//! | `global` | every process | reads it |
//!
//! Ancestry is judged by the owner's PID line from PID 1 recorded when it
//! stored the artifact (a process never changes parent and PIDs are never
//! reused, so the line stays true after the owner exits). Artifacts outlive
//! their owner: they stay until deleted, by the owner, an ancestor of the
//! owner (whatever the visibility: who may kill a process may clean up
//! after it), or the admin. A process that cannot read an artifact is told
//! it does not exist.

use std::time::SystemTime;

use hivekernel_agents::Capability;
use hivekernel_agents::{Artifact, ArtifactId, ArtifactInfo, NewArtifact, Pid, Visibility};

pub use crate::config::ArtifactSettings;
use crate::error::{KernelError, Result};
use crate::events::unix_ms;
use crate::kernel::{Caller, Kernel};
use crate::store::{
    Applied, ArtifactWrite, Store, StoredArtifact, Viewer, Write, in_lineage, lineage,
};

/// Longest artifact name, in bytes.
pub const MAX_ARTIFACT_NAME_BYTES: usize = 256;
/// Longest content type, in bytes.
pub const MAX_CONTENT_TYPE_BYTES: usize = 127;
/// Most artifacts one listing returns (the newest).
pub const MAX_LISTED_ARTIFACTS: usize = 1000;
/// The content type of an artifact stored without one.
pub const DEFAULT_CONTENT_TYPE: &str = "text/plain";

/// Artifacts through the kernel ([`Kernel::artifacts`]): storing, reading,
/// listing and deleting them as the caller may.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactsHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's artifacts.
    pub fn artifacts(&self) -> ArtifactsHandle<'_> {
        ArtifactsHandle { kernel: self }
    }
}

impl<'k> ArtifactsHandle<'k> {
    /// Stores `artifact` as `owner`'s (the caller when `None`; only the
    /// admin may name another process), replacing `owner`'s artifact of the
    /// same name; returns once committed. A refused store changes nothing.
    pub async fn store(
        self,
        caller: Caller,
        owner: Option<Pid>,
        artifact: NewArtifact,
    ) -> Result<ArtifactInfo> {
        let result = async {
            self.kernel
                .require(caller, Capability::WriteArtifact, "store artifacts")?;
            self.store_checked(caller, owner, artifact).await
        };
        self.kernel
            .report_denial(caller, "store_artifact", result.await)
    }

    /// [`ArtifactsHandle::store`], once the caller holds the capability.
    async fn store_checked(
        self,
        caller: Caller,
        owner: Option<Pid>,
        artifact: NewArtifact,
    ) -> Result<ArtifactInfo> {
        check_name(&artifact.name)?;
        let content_type = match artifact.content_type.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_CONTENT_TYPE.to_owned(),
            Some(given) => {
                check_content_type(given)?;
                given.to_owned()
            }
        };
        let limits = self.kernel.inner.settings().artifacts;
        let size = artifact.content.len() as u64;
        if size > limits.max_bytes {
            return Err(KernelError::LimitExceeded(format!(
                "artifact {:?} is {size} bytes, over kernel.artifacts.max_bytes ({} bytes)",
                artifact.name, limits.max_bytes
            )));
        }
        let store = self.artifact_store()?;
        let owner = owner.unwrap_or(caller.pid());
        if let Caller::Process(pid) = caller
            && owner != pid
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {pid} may only store artifacts as itself, not as {owner}"
            )));
        }
        let (owner_name, line) = {
            let table = self.kernel.inner.table().read();
            let entry = table.get(owner).ok_or(KernelError::NotFound(owner))?;
            let line = table.lineage(owner).ok_or(KernelError::NotFound(owner))?;
            (entry.proc.ctx.name.to_string(), lineage(&line))
        };
        let quota = self.kernel.storage_quota(&line);
        let visibility = artifact.visibility.unwrap_or_default();
        let at_ms = unix_ms(SystemTime::now());
        let id = ArtifactId(self.kernel.next_id());
        let write = ArtifactWrite {
            id,
            owner,
            owner_name: owner_name.clone(),
            lineage: line,
            name: artifact.name.clone(),
            content_type: content_type.clone(),
            visibility,
            content: artifact.content,
            at_ms,
            max_owner_bytes: limits.max_bytes_per_owner,
            quota,
        };
        let (id, created_ms) = match store
            .commit_applied(Write::Artifact(Box::new(write)))
            .await?
        {
            Applied::Stored { id, created_ms } => (ArtifactId(id), created_ms),
            Applied::Done | Applied::Absent => (id, at_ms),
            Applied::Refused(why) => return Err(KernelError::LimitExceeded(why)),
        };
        Ok(ArtifactInfo {
            id,
            name: artifact.name,
            owner,
            owner_name,
            content_type,
            visibility,
            size,
            created_at_unix_ms: created_ms,
            updated_at_unix_ms: at_ms,
        })
    }

    /// An artifact the caller may read, with its content.
    pub async fn get(self, caller: Caller, id: ArtifactId) -> Result<Artifact> {
        let store = self.artifact_store()?;
        let stored = store
            .artifact(id, true)
            .await?
            .ok_or(KernelError::ArtifactNotFound(id))?;
        match caller {
            Caller::Admin | Caller::Operator { .. }
                if stored.info.visibility == Visibility::Private
                    && stored.info.owner != Pid::KERNEL =>
            {
                return Err(KernelError::PermissionDenied(format!(
                    "artifact {id} is private to process {} ({}); only its owner may read it",
                    stored.info.owner, stored.info.owner_name
                )));
            }
            Caller::Admin | Caller::Operator { .. } => {}
            Caller::Process(pid) => {
                if !self.may_see(pid, &stored) {
                    return Err(KernelError::ArtifactNotFound(id));
                }
            }
        }
        Ok(Artifact {
            content: stored.content.unwrap_or_default(),
            info: stored.info,
        })
    }

    /// The artifacts the caller may see, newest first, at most `limit`
    /// (and at most [`MAX_LISTED_ARTIFACTS`]); only `owner`'s when given.
    /// The admin sees every artifact, private ones included.
    pub async fn list(
        self,
        caller: Caller,
        owner: Option<Pid>,
        limit: Option<usize>,
    ) -> Result<Vec<ArtifactInfo>> {
        let store = self.artifact_store()?;
        let viewer = match caller {
            Caller::Admin | Caller::Operator { .. } => Viewer::Admin,
            Caller::Process(pid) => Viewer::Process {
                pid,
                lineage: lineage(&self.kernel.lineage_of(pid)),
            },
        };
        let limit = limit
            .filter(|&n| n > 0)
            .map_or(MAX_LISTED_ARTIFACTS, |n| n.min(MAX_LISTED_ARTIFACTS));
        Ok(store.artifacts(viewer, owner, limit).await?)
    }

    /// Deletes an artifact: the admin any, a process one that it or a
    /// descendant of it owns (whatever its visibility).
    pub async fn delete(self, caller: Caller, id: ArtifactId) -> Result<()> {
        let result = async {
            self.kernel
                .require(caller, Capability::WriteArtifact, "delete artifacts")?;
            self.delete_checked(caller, id).await
        };
        self.kernel
            .report_denial(caller, "delete_artifact", result.await)
    }

    /// [`ArtifactsHandle::delete`], once the caller holds the capability.
    async fn delete_checked(self, caller: Caller, id: ArtifactId) -> Result<()> {
        let store = self.artifact_store()?;
        let stored = store
            .artifact(id, false)
            .await?
            .ok_or(KernelError::ArtifactNotFound(id))?;
        // Whoever may kill the owner may clean up after it.
        if let Caller::Process(pid) = caller
            && !in_lineage(&stored.lineage, pid)
        {
            if !self.may_see(pid, &stored) {
                return Err(KernelError::ArtifactNotFound(id));
            }
            return Err(KernelError::PermissionDenied(format!(
                "artifact {id} belongs to process {} ({}); only it, its ancestors \
                 and the operator may delete it",
                stored.info.owner, stored.info.owner_name
            )));
        }
        store.commit(Write::ArtifactDeleted(id)).await?;
        Ok(())
    }

    /// Whether process `pid` may read `stored` (see the module docs).
    fn may_see(self, pid: Pid, stored: &StoredArtifact) -> bool {
        let owner = stored.info.owner;
        match stored.info.visibility {
            _ if owner == pid => true,
            Visibility::Global => true,
            Visibility::Subtree => {
                in_lineage(&stored.lineage, pid) || self.kernel.lineage_of(pid).contains(&owner)
            }
            Visibility::User | Visibility::Private => false,
        }
    }

    fn artifact_store(self) -> Result<&'k Store> {
        self.kernel.durable_store("artifacts")
    }
}

/// A name: not blank, at most [`MAX_ARTIFACT_NAME_BYTES`], no control characters.
fn check_name(name: &str) -> Result<()> {
    let problem = if name.trim().is_empty() {
        "must not be empty or only whitespace"
    } else if name.len() > MAX_ARTIFACT_NAME_BYTES {
        "is too long"
    } else if name.chars().any(char::is_control) {
        "must not contain control characters"
    } else {
        return Ok(());
    };
    Err(KernelError::InvalidArgument(format!(
        "artifact name {problem} (1 to {MAX_ARTIFACT_NAME_BYTES} bytes), got {}",
        crate::error::shown(name)
    )))
}

/// A MIME type, `type/subtype` with optional `; parameters`, printable ASCII.
fn check_content_type(value: &str) -> Result<()> {
    let token = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
    };
    let (essence, params) = value.split_once(';').unwrap_or((value, ""));
    let well_formed = value.len() <= MAX_CONTENT_TYPE_BYTES
        && essence
            .trim()
            .split_once('/')
            .is_some_and(|(kind, sub)| token(kind) && token(sub))
        && params
            .chars()
            .all(|c| c.is_ascii() && !c.is_ascii_control());
    if well_formed {
        Ok(())
    } else {
        Err(KernelError::InvalidArgument(format!(
            "content type must look like type/subtype (such as text/plain or \
             application/json; charset=utf-8), at most {MAX_CONTENT_TYPE_BYTES} bytes of \
             printable ASCII, got {}",
            crate::error::shown(value)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_content_types_are_checked() {
        assert!(check_name("report.md").is_ok());
        assert!(check_name("  ").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"x".repeat(MAX_ARTIFACT_NAME_BYTES + 1)).is_err());
        for good in [
            "text/plain",
            "application/json; charset=utf-8",
            "image/svg+xml",
        ] {
            assert!(check_content_type(good).is_ok(), "{good}");
        }
        for bad in [
            "text",
            "/plain",
            "text/",
            "te xt/plain",
            "a/b\0",
            "text/plain; é",
        ] {
            assert!(check_content_type(bad).is_err(), "{bad:?}");
        }
    }
}
