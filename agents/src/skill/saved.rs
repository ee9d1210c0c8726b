//! Skills processes save with `skill_manage`: who may see one, the changes
//! a process may ask for, and the versions the kernel keeps of each.

use serde::{Deserialize, Serialize};

use crate::named::named_enum;
use crate::process::Pid;

named_enum!(
    /// Who besides the process that saved a skill sees it; `subtree`
    /// unless given. The operator sees every saved skill.
    #[derive(Default)]
    SkillVisibility, "skill visibility" {
        /// The process that saved it only.
        Private = "private",
        /// That process, its ancestors and its descendants: the swarm it leads.
        #[default]
        Subtree = "subtree",
        /// Every process whose tool list selects it.
        Global = "global",
    }
);

named_enum!(
    /// What one version of a saved skill did.
    SkillAction, "skill action" {
        Create = "create",
        Edit = "edit",
        Delete = "delete",
    }
);

/// Where a saved skill came from: its owner and its current version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The process that created it; it, its ancestors and the operator may
    /// change it.
    pub owner: Pid,
    /// The owner's name when it created the skill.
    pub owner_name: String,
    pub visibility: SkillVisibility,
    /// 1 for the first version; one more for every change.
    pub version: u64,
    /// When the current version was written, Unix milliseconds.
    pub updated_at_unix_ms: u64,
}

/// A change to a saved skill, as `skill_manage` asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillWrite {
    /// The skill's name (its `SKILL.md` must carry the same).
    pub name: String,
    pub change: SkillChange,
    /// Why, kept with the version (`skills history`).
    pub reason: Option<String>,
}

/// What a [`SkillWrite`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkillChange {
    /// A new skill from a whole `SKILL.md`.
    Create {
        content: String,
        visibility: SkillVisibility,
    },
    /// A new version of a skill the caller sees and may change.
    Edit {
        rewrite: Rewrite,
        /// A new visibility; the current one when `None`.
        visibility: Option<SkillVisibility>,
    },
    /// The skill is removed; its versions stay in the history.
    Delete,
}

/// How an edit changes the `SKILL.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewrite {
    /// The text stays (a change of visibility alone).
    Keep,
    /// A whole new text.
    Whole(String),
    /// `old`, which must occur exactly once, is replaced by `new`.
    Replace { old: String, new: String },
}

/// One version of a saved skill: what changed, who changed it, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillVersion {
    pub name: String,
    /// The process the skill belongs to.
    pub owner: Pid,
    pub owner_name: String,
    pub version: u64,
    pub action: SkillAction,
    /// Who made the change: the owner, an ancestor of it, or PID 1 for the operator.
    pub by: Pid,
    pub by_name: String,
    /// The visibility from this version on.
    pub visibility: SkillVisibility,
    pub at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The `SKILL.md` as of this version (`None` for a delete, or when not asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}
