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
    /// Whose skill an edit or delete is for, when several of that name
    /// could be meant (the caller's own, or one of its descendants').
    pub owner: Option<Pid>,
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

/// A change as its fields arrive, from a tool call or a gRPC request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillRequest {
    pub action: SkillAction,
    pub name: String,
    pub content: Option<String>,
    pub old: Option<String>,
    pub new: Option<String>,
    pub visibility: Option<SkillVisibility>,
    pub reason: Option<String>,
    pub owner: Option<Pid>,
}

impl SkillRequest {
    /// The change these fields spell, or what is wrong with them: each
    /// action takes its own fields and refuses the others.
    pub fn into_write(self) -> Result<SkillWrite, String> {
        let SkillRequest {
            action,
            name,
            content,
            old,
            new,
            visibility,
            reason,
            owner,
        } = self;
        let unused = |field: &str, given: bool| {
            if given {
                Err(format!("field `{field}` is not used by {action}"))
            } else {
                Ok(())
            }
        };
        let change = match action {
            SkillAction::Create => {
                unused("old", old.is_some())?;
                unused("new", new.is_some())?;
                unused("owner", owner.is_some())?;
                let content = content.ok_or("create needs `content`: the whole SKILL.md")?;
                SkillChange::Create {
                    content,
                    visibility: visibility.unwrap_or_default(),
                }
            }
            SkillAction::Edit => {
                let rewrite = match (content, old, new) {
                    (Some(content), None, None) => Rewrite::Whole(content),
                    (None, Some(old), Some(new)) => Rewrite::Replace { old, new },
                    (None, None, None) if visibility.is_some() => Rewrite::Keep,
                    (None, None, None) => {
                        return Err("edit needs `content` (the whole new SKILL.md), or `old` \
                                    and `new`, or a new `visibility`"
                            .to_owned());
                    }
                    (Some(_), _, _) => {
                        return Err(
                            "edit takes either `content` or `old` and `new`, not both".into()
                        );
                    }
                    (None, _, _) => {
                        return Err("edit with `old` needs `new` too, and the reverse".into());
                    }
                };
                SkillChange::Edit {
                    rewrite,
                    visibility,
                }
            }
            SkillAction::Delete => {
                unused("content", content.is_some())?;
                unused("old", old.is_some())?;
                unused("new", new.is_some())?;
                unused("visibility", visibility.is_some())?;
                SkillChange::Delete
            }
        };
        Ok(SkillWrite {
            name,
            owner,
            change,
            reason: reason.filter(|r| !r.trim().is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    fn write(value: Value) -> Result<SkillWrite, String> {
        serde_json::from_value::<SkillRequest>(value)
            .map_err(|e| e.to_string())?
            .into_write()
    }

    #[test]
    fn each_action_takes_its_own_fields_and_refuses_the_others() {
        let created = write(json!({"action": "create", "name": "x", "content": "---"})).unwrap();
        assert_eq!(
            created.change,
            SkillChange::Create {
                content: "---".into(),
                visibility: SkillVisibility::Subtree
            }
        );
        let patched =
            write(json!({"action": "edit", "name": "x", "old": "a", "new": "", "owner": 7}))
                .unwrap();
        assert_eq!(patched.owner, Some(Pid(7)));
        assert_eq!(
            patched.change,
            SkillChange::Edit {
                rewrite: Rewrite::Replace {
                    old: "a".into(),
                    new: String::new()
                },
                visibility: None
            }
        );
        let moved = write(json!({"action": "edit", "name": "x", "visibility": "global"})).unwrap();
        assert!(matches!(
            moved.change,
            SkillChange::Edit {
                rewrite: Rewrite::Keep,
                ..
            }
        ));
        for (bad, says) in [
            (json!({"name": "x"}), "missing field `action`"),
            (json!({"action": "create", "name": "x"}), "needs `content`"),
            (
                json!({"action": "create", "name": "x", "content": "c", "owner": 3}),
                "`owner` is not used",
            ),
            (json!({"action": "edit", "name": "x"}), "edit needs"),
            (
                json!({"action": "edit", "name": "x", "old": "a"}),
                "needs `new`",
            ),
            (
                json!({"action": "edit", "name": "x", "content": "c", "old": "a", "new": "b"}),
                "not both",
            ),
            (
                json!({"action": "delete", "name": "x", "content": "c"}),
                "not used by delete",
            ),
            (
                json!({"action": "delete", "name": "x", "visibility": "global"}),
                "not used by delete",
            ),
            (
                json!({"action": "rename", "name": "x"}),
                "unknown skill action",
            ),
            (
                json!({"action": "create", "name": "x", "content": "c", "visibility": "user"}),
                "unknown skill visibility",
            ),
        ] {
            let err = write(bad.clone()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
