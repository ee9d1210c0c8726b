//! The `probe` runtime: a scriptable test agent.
//!
//! Every message it receives is recorded in a journal the test can read.
//! A task's description is a command:
//! - `sleep MS`: sleeps, then answers `slept MS`;
//! - `panic`: panics inside the runtime;
//! - `fail TEXT`: answers with an error;
//! - `spawn NAME [ROLE]`: spawns a child through its syscalls, answers its PID;
//! - `exec PID TEXT`: runs a task on PID, answers its output;
//! - `delegate PID TEXT`: delegate_async, answers the request id;
//! - `send PID TEXT`: send_message, answers the message id;
//! - `kill PID`: kills PID, answers the killed PIDs;
//! - `wait PID`: wait_child, answers the exit code;
//! - `exit CODE [REASON]`: ends its own process with CODE (0: a normal exit);
//! - anything else: answered as is.
//!
//! A message whose payload is `crash` makes `on_message` fail, which ends the
//! process with a runtime error (exit code 1).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hivekernel_agents::{
    Message, Outgoing, Pid, ProcessContext, Role, Runtime, RuntimeError, RuntimeFactory,
    SpawnRequest, Task, TaskReply, TaskSpec,
};
use parking_lot::Mutex;

/// Messages the probes of one kernel received, per PID.
#[derive(Debug, Clone, Default)]
pub struct Journal(Arc<Mutex<HashMap<Pid, Vec<Message>>>>);

impl Journal {
    /// Messages `pid` received so far, in order.
    pub fn of(&self, pid: Pid) -> Vec<Message> {
        self.0.lock().get(&pid).cloned().unwrap_or_default()
    }

    fn record(&self, pid: Pid, message: Message) {
        self.0.lock().entry(pid).or_default().push(message);
    }
}

/// Creates a [`Probe`] per process, all writing to one [`Journal`].
#[derive(Debug, Default)]
pub struct ProbeFactory {
    /// Where the probes record messages.
    pub journal: Journal,
}

impl RuntimeFactory for ProbeFactory {
    fn create(&self, _ctx: &ProcessContext) -> Result<Arc<dyn Runtime>, RuntimeError> {
        Ok(Arc::new(Probe {
            journal: self.journal.clone(),
        }))
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Probe {
    journal: Journal,
}

fn pid_arg(word: Option<&str>) -> Result<Pid, String> {
    word.and_then(|w| w.parse().ok())
        .map(Pid)
        .ok_or_else(|| "expected a pid".to_owned())
}

#[async_trait]
impl Runtime for Probe {
    async fn execute(&self, ctx: &ProcessContext, task: Task) -> TaskReply {
        let text = task.description.clone();
        let mut words = text.splitn(3, ' ');
        let verb = words.next().unwrap_or_default();
        let sys = &ctx.syscalls;
        match verb {
            "sleep" => {
                let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(format!("slept {ms}"))
            }
            "panic" => panic!("probe asked to panic"),
            "fail" => Err(words.collect::<Vec<_>>().join(" ")),
            "spawn" => {
                let name = words.next().unwrap_or("child");
                let mut request = SpawnRequest::new(ctx.pid, name);
                if let Some(role) = words.next() {
                    request.role = role.parse::<Role>()?;
                }
                request.runtime = Some("probe".into());
                sys.spawn_child(request)
                    .await
                    .map(|p| p.to_string())
                    .map_err(|e| e.to_string())
            }
            "exec" => {
                let to = pid_arg(words.next())?;
                let rest = words.next().unwrap_or_default();
                sys.execute_task(TaskSpec::new(to, rest))
                    .await
                    .map_err(|e| e.to_string())?
            }
            "delegate" => {
                let to = pid_arg(words.next())?;
                let rest = words.next().unwrap_or_default();
                sys.delegate_async(TaskSpec::new(to, rest))
                    .await
                    .map(|r| r.to_string())
                    .map_err(|e| e.to_string())
            }
            "send" => {
                let to = pid_arg(words.next())?;
                let rest = words.next().unwrap_or_default();
                sys.send_message(Outgoing::new(to, rest))
                    .await
                    .map(|id| id.to_string())
                    .map_err(|e| e.to_string())
            }
            "kill" => {
                let pid = pid_arg(words.next())?;
                sys.kill(pid, "probe kill")
                    .await
                    .map(|killed| format!("{:?}", killed.exited))
                    .map_err(|e| e.to_string())
            }
            "exit" => {
                let code = words
                    .next()
                    .and_then(|w| w.parse().ok())
                    .ok_or_else(|| "expected an exit code".to_owned())?;
                let reason = words.next().unwrap_or_default();
                sys.exit(code, reason)
                    .await
                    .map(|()| "exited".to_owned())
                    .map_err(|e| e.to_string())
            }
            "wait" => {
                let pid = pid_arg(words.next())?;
                sys.wait_child(pid, Some(Duration::from_secs(5)))
                    .await
                    .map(|r| r.exit_code.to_string())
                    .map_err(|e| e.to_string())
            }
            _ => Ok(text),
        }
    }

    async fn on_message(&self, ctx: &ProcessContext, message: Message) -> Result<(), RuntimeError> {
        if message.payload == "crash" {
            return Err(RuntimeError("probe asked to crash".into()));
        }
        self.journal.record(ctx.pid, message);
        Ok(())
    }
}
