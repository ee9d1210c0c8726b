//! Size limits on what callers send (`kernel.limits`).
//!
//! Every string, list and map that a gRPC client, an `exec` agent or a
//! model's tool call controls has a limit here, so no caller can make the
//! kernel hold or store more than the operator allowed. A request past one
//! is refused whole with INVALID_ARGUMENT naming the field, its size, the
//! limit and the setting that raises it; nothing is kept of it.
//!
//! Names (of processes, cron entries, artifacts) have their own fixed rules
//! next to the things they name; memory and artifacts have theirs in
//! `kernel.memory` and `kernel.artifacts`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use hivekernel_agents::{ExecCommand, Outgoing, SpawnRequest, TaskSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use validator::Validate;

use crate::error::KernelError;

/// Largest payload the kernel can be told to accept: requests carry it
/// whole, so the gRPC server's request limit grows with it.
const MAX_PAYLOAD_BYTES: usize = 16 << 20;

/// What one string, list or map a caller sends may hold (`kernel.limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(deny_unknown_fields, default)]
pub struct InputLimits {
    /// A message's `type`.
    #[validate(range(min = 1, max = 65_536))]
    pub type_bytes: usize,
    /// A kill's `reason`.
    #[validate(range(min = 1, max = 1_048_576))]
    pub reason_bytes: usize,
    /// A spawn's `model` and `runtime`.
    #[validate(range(min = 1, max = 65_536))]
    pub model_bytes: usize,
    /// A spawn's `system_prompt`, and every prompt file of the config
    /// (`system_prompt_file`, `worker_prompt_file`).
    #[validate(range(min = 1, max = MAX_PAYLOAD_BYTES))]
    pub prompt_bytes: usize,
    /// A message's `payload`; a task's `description` and parameter values
    /// together; a task's `output` or `error` from an `exec` agent; a cron
    /// entry's `description`.
    #[validate(range(min = 1, max = MAX_PAYLOAD_BYTES))]
    pub payload_bytes: usize,
    /// Entries of a spawn's `tools` (a name listed twice is refused too).
    #[validate(range(min = 1, max = 10_000))]
    pub tools: usize,
    /// Entries of a spawn's `metadata`, and of a task's `params`.
    #[validate(range(min = 1, max = 10_000))]
    pub metadata_entries: usize,
    /// Each `metadata` key and value, and each `params` name.
    #[validate(range(min = 1, max = 1_048_576))]
    pub metadata_bytes: usize,
    /// An `exec` spawn's `command` and `env` together (each argument and
    /// variable counts one byte more).
    #[validate(range(min = 1, max = MAX_PAYLOAD_BYTES))]
    pub command_bytes: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            type_bytes: 128,
            reason_bytes: 1024,
            model_bytes: 256,
            prompt_bytes: 256 << 10,
            payload_bytes: 1 << 20,
            tools: 128,
            metadata_entries: 64,
            metadata_bytes: 1024,
            command_bytes: 64 << 10,
        }
    }
}

/// Why a request was refused: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// The field, as the gRPC API and the config spell it (`system_prompt`).
    pub field: &'static str,
    /// What is wrong, e.g. `is 300000 bytes, at most 262144 (kernel.limits.prompt_bytes)`.
    pub problem: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}

impl From<InputError> for KernelError {
    fn from(err: InputError) -> Self {
        KernelError::InvalidArgument(err.to_string())
    }
}

type Checked = Result<(), InputError>;

/// Refuses `len` bytes past `max`; `setting` is the `kernel.limits` key.
fn bytes(field: &'static str, setting: &str, len: usize, max: usize) -> Checked {
    if len > max {
        return Err(InputError {
            field,
            problem: format!("is {len} bytes, at most {max} (kernel.limits.{setting})"),
        });
    }
    Ok(())
}

/// Refuses `count` entries past `max`; `setting` is the `kernel.limits` key.
fn entries(field: &'static str, setting: &str, count: usize, max: usize) -> Checked {
    if count > max {
        return Err(InputError {
            field,
            problem: format!("has {count} entries, at most {max} (kernel.limits.{setting})"),
        });
    }
    Ok(())
}

impl InputLimits {
    /// A message's type.
    pub fn check_type(&self, kind: &str) -> Checked {
        bytes("type", "type_bytes", kind.len(), self.type_bytes)
    }

    /// A kill's reason.
    pub fn check_reason(&self, reason: &str) -> Checked {
        bytes("reason", "reason_bytes", reason.len(), self.reason_bytes)
    }

    /// A payload-sized text: `field` names it (`payload`, `description`, `output`).
    pub fn check_payload(&self, field: &'static str, text: &str) -> Checked {
        bytes(field, "payload_bytes", text.len(), self.payload_bytes)
    }

    /// A system prompt.
    pub fn check_prompt(&self, prompt: &str) -> Checked {
        bytes(
            "system_prompt",
            "prompt_bytes",
            prompt.len(),
            self.prompt_bytes,
        )
    }

    /// A message to send: its type and payload.
    pub fn check_message(&self, message: &Outgoing) -> Checked {
        self.check_type(&message.kind)?;
        self.check_payload("payload", &message.payload)
    }

    /// A task to run: its description and parameters.
    pub fn check_task(&self, task: &TaskSpec) -> Checked {
        entries(
            "params",
            "metadata_entries",
            task.params.len(),
            self.metadata_entries,
        )?;
        let mut total = task.description.len();
        for (name, value) in &task.params {
            bytes("params", "metadata_bytes", name.len(), self.metadata_bytes)?;
            total = total.saturating_add(value.len());
        }
        if total > self.payload_bytes {
            let field = if task.params.is_empty() {
                "description"
            } else {
                "description with params"
            };
            return bytes(field, "payload_bytes", total, self.payload_bytes);
        }
        Ok(())
    }

    /// Everything of a spawn request a caller sets: model, runtime, prompt,
    /// tools (no name twice), metadata and the `exec` command.
    pub fn check_spawn(&self, request: &SpawnRequest) -> Checked {
        // Spawn is a hot path: a request with no lists and short texts passes at once.
        let texts = request.model.len() + request.runtime.as_ref().map_or(0, String::len);
        if request.tools.is_empty()
            && request.metadata.is_empty()
            && request.exec.is_none()
            && texts <= self.model_bytes
            && request.system_prompt.len() <= self.prompt_bytes
        {
            return Ok(());
        }
        self.check_model("model", &request.model)?;
        if let Some(runtime) = &request.runtime {
            self.check_model("runtime", runtime)?;
        }
        self.check_prompt(&request.system_prompt)?;
        self.check_tools(&request.tools)?;
        self.check_metadata(&request.metadata)?;
        if let Some(exec) = &request.exec {
            self.check_command(exec)?;
        }
        Ok(())
    }

    /// A model or runtime name.
    pub fn check_model(&self, field: &'static str, name: &str) -> Checked {
        bytes(field, "model_bytes", name.len(), self.model_bytes)
    }

    /// A tool list: at most `tools` entries, none twice.
    pub fn check_tools(&self, tools: &[String]) -> Checked {
        self.check_tool_count(tools)?;
        // Spawn is a hot path and most lists are short: compare those in place.
        let twice = if tools.len() <= 16 {
            tools
                .iter()
                .enumerate()
                .find(|(i, tool)| tools[..*i].contains(tool))
                .map(|(_, tool)| tool)
        } else {
            let mut seen = HashSet::with_capacity(tools.len());
            tools.iter().find(|tool| !seen.insert(tool.as_str()))
        };
        match twice {
            Some(tool) => Err(InputError {
                field: "tools",
                problem: format!("lists {} twice", crate::error::shown(tool)),
            }),
            None => Ok(()),
        }
    }

    /// A tool list's length.
    pub fn check_tool_count(&self, tools: &[String]) -> Checked {
        entries("tools", "tools", tools.len(), self.tools)
    }

    /// Metadata labels: at most `metadata_entries`, each key and value at
    /// most `metadata_bytes`.
    pub fn check_metadata(&self, metadata: &BTreeMap<String, String>) -> Checked {
        entries(
            "metadata",
            "metadata_entries",
            metadata.len(),
            self.metadata_entries,
        )?;
        for (key, value) in metadata {
            if key.len() > self.metadata_bytes || value.len() > self.metadata_bytes {
                let (what, len) = if key.len() > self.metadata_bytes {
                    ("key", key.len())
                } else {
                    ("value", value.len())
                };
                return Err(InputError {
                    field: "metadata",
                    problem: format!(
                        "{what} of {} is {len} bytes, at most {} (kernel.limits.metadata_bytes)",
                        crate::error::shown(key),
                        self.metadata_bytes
                    ),
                });
            }
        }
        Ok(())
    }

    /// An `exec` command: program, arguments, environment and working
    /// directory together (each entry counts one byte more, for its end).
    pub fn check_command(&self, command: &ExecCommand) -> Checked {
        let argv = command.argv.iter().map(|arg| arg.len() + 1);
        let env = command.env.iter().map(|(k, v)| k.len() + v.len() + 2);
        let cwd = command
            .cwd
            .as_ref()
            .map_or(0, |dir| dir.as_os_str().len() + 1);
        let total = argv
            .chain(env)
            .fold(cwd, |sum, len| sum.saturating_add(len));
        if total > self.command_bytes {
            return Err(InputError {
                field: "command",
                problem: format!(
                    "with its env is {total} bytes, at most {} (kernel.limits.command_bytes)",
                    self.command_bytes
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use hivekernel_agents::Pid;

    use super::*;

    #[test]
    fn each_refusal_names_the_field_its_size_and_the_setting() {
        let limits = InputLimits::default();
        let err = limits.check_reason(&"r".repeat(1025)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "reason is 1025 bytes, at most 1024 (kernel.limits.reason_bytes)"
        );
        assert!(limits.check_reason(&"r".repeat(1024)).is_ok());

        let mut spawn = SpawnRequest::new(Pid(1), "w");
        spawn.tools = vec!["read_file".into(), "web_fetch".into(), "read_file".into()];
        let err = limits.check_spawn(&spawn).unwrap_err();
        assert_eq!(err.to_string(), "tools lists \"read_file\" twice");

        spawn.tools = (0..129).map(|i| format!("t{i}")).collect();
        let err = limits.check_spawn(&spawn).unwrap_err();
        assert!(
            err.to_string().contains("has 129 entries, at most 128"),
            "{err}"
        );

        spawn.tools.clear();
        spawn.metadata = (0..3)
            .map(|i| (format!("k{i}"), "v".repeat(1025)))
            .collect();
        let err = limits.check_spawn(&spawn).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("metadata value of \"k0\" is 1025 bytes"),
            "{err}"
        );
    }

    #[test]
    fn a_task_counts_its_description_and_parameter_values_together() {
        let limits = InputLimits {
            payload_bytes: 10,
            ..InputLimits::default()
        };
        let mut task = TaskSpec::new(Pid(2), "12345");
        task.params.insert("a".into(), "12345".into());
        assert!(limits.check_task(&task).is_ok());
        task.params.insert("b".into(), "1".into());
        let err = limits.check_task(&task).unwrap_err();
        assert_eq!(
            err.to_string(),
            "description with params is 11 bytes, at most 10 (kernel.limits.payload_bytes)"
        );
    }

    #[test]
    fn a_command_counts_its_arguments_and_environment() {
        let limits = InputLimits {
            command_bytes: 13,
            ..InputLimits::default()
        };
        let mut command = ExecCommand {
            argv: vec!["sh".into(), "-c".into()],
            ..Default::default()
        };
        command.env.insert("A".into(), "1234".into());
        assert!(limits.check_command(&command).is_ok(), "3 + 3 + 7 bytes");
        command.argv.push(String::new());
        assert!(
            limits.check_command(&command).is_err(),
            "an empty argument counts"
        );
    }
}
