//! `skill_manage`: create, edit and delete the caller's skills in the
//! kernel's store (the `manage_skills` capability). A write is checked by
//! every rule of the Agent Skills format and refused with every problem
//! found; only skills processes saved may be changed, never the config's.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::invalid;
use super::{Tool, ToolContext, ToolError, decode, refused};
use crate::capability::Capability;
use crate::skill::{Rewrite, SkillAction, SkillChange, SkillVisibility, SkillWrite};

/// The `skill_manage` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct SkillManage;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    action: SkillAction,
    name: String,
    content: Option<String>,
    old: Option<String>,
    new: Option<String>,
    visibility: Option<SkillVisibility>,
    reason: Option<String>,
}

#[async_trait]
impl Tool for SkillManage {
    fn name(&self) -> &'static str {
        "skill_manage"
    }

    fn description(&self) -> &'static str {
        "Save a procedure as a skill (a SKILL.md: YAML frontmatter with name and description, then \
         Markdown steps), or edit or delete one you saved. Checked against the Agent Skills format; \
         a refusal lists every problem. Skills from the config cannot be changed."
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::ManageSkills)
    }

    fn parameters(&self) -> Value {
        let visibilities: Vec<&str> = SkillVisibility::ALL.iter().map(|v| v.as_str()).collect();
        let actions: Vec<&str> = SkillAction::ALL.iter().map(|a| a.as_str()).collect();
        json!({
            "type": "object",
            "properties": {
                "action": { "type": "string", "enum": actions },
                "name": {
                    "type": "string",
                    "description": "The skill's name: 1-64 of a-z, 0-9 and single hyphens, as in its frontmatter."
                },
                "content": {
                    "type": "string",
                    "description": "create, or edit replacing it whole: the SKILL.md, starting with ---\\nname: ...\\ndescription: ...\\n---"
                },
                "old": { "type": "string", "description": "edit: text that occurs exactly once in the SKILL.md" },
                "new": { "type": "string", "description": "edit: what replaces `old`" },
                "visibility": {
                    "type": "string",
                    "enum": visibilities,
                    "description": "Who sees it: private (you), subtree (you, your ancestors and descendants; default), global (every agent)."
                },
                "reason": { "type": "string", "description": "Why, kept in the skill's history." }
            },
            "required": ["action", "name"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: Args = decode(self, args)?;
        let write = write(args).map_err(|why| invalid(self, why))?;
        let version = ctx
            .process
            .syscalls
            .manage_skill(write)
            .await
            .map_err(refused)?;
        Ok(match version.action {
            SkillAction::Delete => format!(
                "deleted skill {} (version {} in its history)",
                version.name, version.version
            ),
            action => format!(
                "{} skill {}: version {}, visible to {}",
                match action {
                    SkillAction::Create => "created",
                    _ => "edited",
                },
                version.name,
                version.version,
                match version.visibility {
                    SkillVisibility::Private => "you only",
                    SkillVisibility::Subtree => "you, your ancestors and your descendants",
                    SkillVisibility::Global => "every agent",
                }
            ),
        })
    }
}

/// The change `args` spell, or what is wrong with them.
fn write(args: Args) -> Result<SkillWrite, String> {
    let Args {
        action,
        name,
        content,
        old,
        new,
        visibility,
        reason,
    } = args;
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
                    return Err(
                        "edit needs `content` (the whole new SKILL.md), or `old` and `new`, \
                         or a new `visibility`"
                            .to_owned(),
                    );
                }
                (Some(_), _, _) => {
                    return Err("edit takes either `content` or `old` and `new`, not both".into());
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
        change,
        reason: reason.filter(|r| !r.trim().is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(value: Value) -> Result<SkillWrite, String> {
        write(serde_json::from_value(value).map_err(|e| e.to_string())?)
    }

    #[test]
    fn arguments_spell_one_change_or_are_refused() {
        let created = args(json!({"action": "create", "name": "x", "content": "---"})).unwrap();
        assert_eq!(
            created.change,
            SkillChange::Create {
                content: "---".into(),
                visibility: SkillVisibility::Subtree
            }
        );
        let patched = args(json!({"action": "edit", "name": "x", "old": "a", "new": "b"})).unwrap();
        assert_eq!(
            patched.change,
            SkillChange::Edit {
                rewrite: Rewrite::Replace {
                    old: "a".into(),
                    new: "b".into()
                },
                visibility: None
            }
        );
        let moved = args(json!({"action": "edit", "name": "x", "visibility": "global"})).unwrap();
        assert!(matches!(
            moved.change,
            SkillChange::Edit {
                rewrite: Rewrite::Keep,
                ..
            }
        ));
        for (bad, says) in [
            (json!({"action": "create", "name": "x"}), "needs `content`"),
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
                json!({"action": "rename", "name": "x"}),
                "unknown skill action",
            ),
            (
                json!({"action": "create", "name": "x", "content": "c", "visibility": "user"}),
                "unknown skill visibility",
            ),
        ] {
            let err = args(bad.clone()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
