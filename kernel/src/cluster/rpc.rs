//! Requests between nodes: JSON over NATS request/reply on
//! `hk.node.<node>.rpc` (docs/CLUSTER.md, "Messages between nodes").
//! A request names its sender and the sender's epoch; an answer is
//! `{"ok": ...}` or `{"error": {"kind", "message"}}` with the class of
//! error the operation would have given locally, so a caller sees the
//! same error whichever node it reached.

use bytes::Bytes;
use hivekernel_agents::{
    ErrorKind, Message, MessageId, Outgoing, Pid, ProcessInfo, RequestId, SpawnRequest, TaskSpec,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Most PIDs one `get` names: its answer stays well under NATS's default
/// 1 MiB message limit.
pub const MAX_GET: usize = 200;

/// One operation a node asks of another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", content = "args", rename_all = "snake_case")]
pub enum Op {
    /// Snapshots of these processes, skipping those the node does not hold.
    Get {
        /// At most [`MAX_GET`].
        pids: Vec<Pid>,
    },
    /// A spawn by an operator the asking node checked, placed on this node:
    /// under PID 1, a process the node holds, or one another node holds
    /// (which lends the child what it takes from its parent, [`Op::Lend`]);
    /// answers the new PID once every node can find it ([`Spawned`]).
    Spawn {
        request: Box<SpawnRequest>,
        /// An `exec` process's command (which the request does not carry
        /// when serialized).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<Command>,
        /// The node the spawn named, if it named one (kept with its spec).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// The labels the spawn asked of its node.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        labels: std::collections::BTreeMap<String, String>,
    },
    /// A spawn by process `from` of its own child, which the node holds
    /// (the process reached the asking node with its token); answers the
    /// new PID as [`Op::Spawn`] does. An op of its own, so that a node
    /// that does not know it refuses it rather than spawn as an operator.
    SpawnOwn {
        request: Box<SpawnRequest>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<Command>,
        from: Pid,
    },
    /// A kill of a process the node holds, with its subtree, by an
    /// operator or an ancestor the asking node checked; answers the PIDs
    /// that exited ([`Killed`]). `orphaned`: its parent, on the asking
    /// node, has exited, so nobody is told and nothing waits as a zombie.
    Kill {
        pid: Pid,
        reason: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        orphaned: bool,
    },
    /// A child `child` of process `parent`, which the node holds, is
    /// being spawned on the asking node (or comes back there): the node
    /// holds a child slot of `parent` for it and answers what the child
    /// takes from its parent (`ParentGrant`), or refuses as a spawn under
    /// `parent` there would be.
    /// `held`: the slot must be held already (a child coming back, or
    /// one confirming, once spawned, that its parent still waits for it).
    Lend {
        parent: Pid,
        child: Pid,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        held: bool,
        /// The child's own token budget (`max_tokens_total`), lent from
        /// the budget `parent` draws on, if it draws on one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens: Option<u64>,
    },
    /// Child `child` of process `parent`, which the node holds, exited on
    /// the asking node having spent `spent` tokens of the budget lent to
    /// it: the node charges the loan, once, and gives the rest back.
    Repay { parent: Pid, child: Pid, spent: u64 },
    /// The asking node did not spawn the child `Lend` held a slot for:
    /// the slot is freed.
    Release { parent: Pid, child: Pid },
    /// A restart of a live process the node holds, by an operator or an
    /// ancestor the asking node checked; answers how many times it has
    /// now been restarted ([`Restarted`]). `sibling`: its parent's
    /// strategy takes it down with a sibling on the asking node, so it
    /// stops, and restarts as its policy says after a failure, after the
    /// sibling's delay `delay_ms` (a temporary one ends), answering nothing.
    Restart {
        pid: Pid,
        reason: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sibling: bool,
        #[serde(default, skip_serializing_if = "is_zero")]
        delay_ms: u64,
    },
    /// Child `failed` of process `parent`, which the node holds, stopped
    /// on the asking node to restart after `delay_ms`: the node stops the
    /// siblings `parent`'s strategy takes down with it.
    Siblings {
        parent: Pid,
        failed: Pid,
        delay_ms: u64,
    },
    /// A child on the asking node of process `pid`, which the node holds,
    /// passed its restart intensity: `pid` fails for `reason`, unless it
    /// is no longer the run that started at `started_ms` (as the asking
    /// node's directory lists it; 0: unknown), having restarted since.
    Fail {
        pid: Pid,
        reason: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        started_ms: u64,
    },
    /// A wait for a process the node holds, by an operator or its parent
    /// the asking node checked, for up to `timeout_ms` (at most
    /// [`MAX_WAIT_MS`]); answers its exit record once it has exited, and
    /// collects it there ([`hivekernel_agents::ExitRecord`]).
    Wait { pid: Pid, timeout_ms: u64 },
    /// A message to a process the node holds, from `from` (an operator
    /// when absent: PID 1), routed by the asking node (`via`, its nearest
    /// common ancestor across branches); answers its id once the node has
    /// it as a local send would ([`Sent`]).
    Deliver {
        message: Outgoing,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<Pid>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<Pid>,
    },
    /// A task on a process the node holds, from `from` (an operator when
    /// absent), with its timeout set; answers when it ends ([`Executed`]).
    Task {
        task: TaskSpec,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<Pid>,
    },
    /// A `delegate_async` task from process `from` of the asking node,
    /// which knows it as `request_id`; answered once queued. Its answer
    /// comes back as a [`Op::Post`] of a `task_response` naming
    /// `request_id`.
    Delegate {
        task: TaskSpec,
        from: Pid,
        request_id: RequestId,
    },
    /// A tree of lost node `lost` (epoch `epoch`), offered by a node that
    /// judged the loss and whose name or labels the root's placement rules
    /// out: its processes as the directory listed them, root first. The
    /// node takes it over as its own judge would; answered at once.
    Adopt {
        lost: String,
        epoch: u64,
        members: Vec<(Pid, crate::cluster::Listing)>,
    },
    /// `pid`'s transcript entries matching `query` (the asking node
    /// checked its caller may read them); answers a [`crate::transcript::Page`].
    Transcript {
        pid: Pid,
        query: crate::transcript::Query,
    },
    /// A piece of the log file of `exec` process `pid` (the asking node
    /// checked its caller may read it): `max_bytes` from `from`, or the
    /// last `max_bytes` when `from` is `None`; answers a
    /// [`crate::kernel::LogChunk`].
    ExecLog {
        pid: Pid,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<u64>,
        max_bytes: u64,
    },
    /// A message the kernel made (a task's answer, a copy to a parent, a
    /// notice) for a process the node holds; the node gives it an id of
    /// its own. `done`: the `delegate_async` request it answers, which the
    /// node recorded and now removes with the same write. `key`: the id
    /// the message is kept under in `HK_MAIL`, the same the sending node
    /// leaves it under when the node does not answer, so it is stored once.
    Post {
        message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        done: Option<RequestId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// An operator's cron entry aimed at a process the node holds (the
    /// asking node checked the operator's rights); answers its
    /// [`hivekernel_agents::cron::CronInfo`].
    CronAdd {
        spec: Box<hivekernel_agents::cron::CronSpec>,
    },
    /// The node's cron entries, every one; answers a list of
    /// [`hivekernel_agents::cron::CronInfo`].
    CronList,
    /// An operator's change of the node's cron entry `name`; answers the
    /// entry after it (none after a removal).
    Cron { name: String, change: CronChange },
}

/// What [`Op::Cron`] does to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CronChange {
    Remove,
    Enable(bool),
    Run,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What [`Op::Kill`] answers.
pub use hivekernel_agents::Killed;
/// The OS command of an `exec` process as it travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<std::path::PathBuf>,
}

impl Op {
    /// A spawn as it travels, its `exec` command and its placement beside it.
    pub fn spawn(
        mut request: SpawnRequest,
        node: Option<String>,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Op {
        let command = request.exec.take().map(|exec| Command {
            argv: exec.argv,
            env: exec.env,
            cwd: exec.cwd,
        });
        Op::Spawn {
            request: Box::new(request),
            command,
            node,
            labels,
        }
    }

    /// A process's spawn of its own child as it travels.
    pub fn spawn_own(request: SpawnRequest, from: Pid) -> Op {
        match Op::spawn(request, None, Default::default()) {
            Op::Spawn {
                request, command, ..
            } => Op::SpawnOwn {
                request,
                command,
                from,
            },
            other => other,
        }
    }
}

/// A spawn's request as it arrived, its `exec` command back in it.
pub fn spawned(request: Box<SpawnRequest>, command: Option<Command>) -> SpawnRequest {
    let mut request = *request;
    request.exec = command.map(|command| hivekernel_agents::ExecCommand {
        argv: command.argv,
        env: command.env,
        cwd: command.cwd,
    });
    request
}

/// What [`Op::Spawn`] answers.
pub type Spawned = Pid;
/// What [`Op::Restart`] answers.
pub type Restarted = u32;
/// The longest one [`Op::Wait`] waits: a longer wait is asked for in
/// rounds, so that no request between nodes is open without limit.
pub const MAX_WAIT_MS: u64 = 30_000;
/// What [`Op::Deliver`] answers.
pub type Sent = MessageId;
/// What [`Op::Task`] answers: the request id and the task's reply.
pub type Executed = (hivekernel_agents::RequestId, hivekernel_agents::TaskReply);

/// Most bytes of snapshots one `get` answers: under NATS's default 1 MiB
/// message limit, whatever the processes' metadata.
pub const GET_BYTES: usize = 768 * 1024;

/// What [`Op::Get`] answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Got {
    /// Snapshots of the PIDs asked that the node holds, in the order asked.
    pub processes: Vec<ProcessInfo>,
    /// PIDs asked that did not fit in this answer ([`GET_BYTES`]): ask again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rest: Vec<Pid>,
}

impl Got {
    /// The answer to a `get` of `asked`, of the snapshots `found` (`None`
    /// where the node does not hold the PID), cut at [`GET_BYTES`] (but
    /// never before the first snapshot).
    pub fn cut(asked: &[Pid], found: Vec<Option<ProcessInfo>>) -> Got {
        let mut got = Got::default();
        let mut bytes = 0;
        for (at, info) in found.into_iter().enumerate() {
            let Some(info) = info else { continue };
            let size = serde_json::to_vec(&info).map_or(0, |encoded| encoded.len());
            if !got.processes.is_empty() && bytes + size > GET_BYTES {
                got.rest = asked.get(at..).unwrap_or_default().to_vec();
                break;
            }
            bytes += size;
            got.processes.push(info);
        }
        got
    }
}

/// A request as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The node asking.
    pub from_node: String,
    /// Its epoch.
    pub epoch: u64,
    #[serde(flatten)]
    pub op: Op,
}

/// Why a node refused a request: the class and message the operation
/// would have given locally.
pub type Refusal = hivekernel_agents::SyscallError;

/// An answer as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer<T> {
    Ok(T),
    Error(Refusal),
}

/// The subject `node` answers requests on.
pub fn subject(node: &str) -> String {
    format!("hk.node.{node}.rpc")
}

/// A request as bytes.
pub fn encode<T: Serialize>(value: &T) -> Bytes {
    // Plain data: serializing it cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

/// An answer refusing a request.
pub fn refused(refusal: Refusal) -> Bytes {
    encode(&Answer::<()>::Error(refusal))
}

/// Reads a request a peer sent; refused as an invalid argument naming
/// what is wrong.
pub fn decode_request(payload: &[u8]) -> Result<Request, Refusal> {
    serde_json::from_slice(payload).map_err(|err| Refusal {
        kind: ErrorKind::InvalidArgument,
        message: format!("unreadable cluster request: {err}"),
    })
}

/// Reads an answer a peer sent.
pub fn decode_answer<T: DeserializeOwned>(node: &str, payload: &[u8]) -> Result<T, Refusal> {
    match serde_json::from_slice::<Answer<T>>(payload) {
        Ok(Answer::Ok(value)) => Ok(value),
        Ok(Answer::Error(refusal)) => Err(refusal),
        Err(err) => Err(Refusal {
            kind: ErrorKind::Internal,
            message: format!("node {node} answered what this node cannot read: {err}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_as_the_design_writes_it() {
        let request = Request {
            from_node: "a".into(),
            epoch: 7,
            op: Op::Get {
                pids: vec![Pid(12)],
            },
        };
        let text = String::from_utf8(encode(&request).to_vec()).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"from_node":"a","epoch":7,"op":"get","args":{"pids":[12]}}"#
        );
        assert_eq!(decode_request(text.as_bytes()), Ok(request));
    }

    #[test]
    fn routed_operations_read_with_and_without_their_sender() {
        // An operator's send names no sender: PID 1 sends it.
        let text = r#"{"from_node":"a","epoch":2,"op":"deliver","args":{"message":{"to":9,"kind":"message","payload":"hi","priority":"normal","ttl":null}}}"#;
        let request = decode_request(text.as_bytes());
        assert!(
            matches!(&request, Ok(Request { op: Op::Deliver { from: None, via: None, message }, .. })
                if message.to == Pid(9) && message.payload == "hi"),
            "{request:?}"
        );
        let message: Message = serde_json::from_value(serde_json::json!({
            "id": 0, "from": 12, "to": 9, "kind": "task_response", "payload": "{}",
            "priority": "high", "request_id": 77, "via": null
        }))
        .unwrap_or_else(|err| panic!("{err}"));
        for op in [
            Op::Post {
                message,
                done: Some(RequestId(77)),
                key: Some("a.3.p12".into()),
            },
            Op::Delegate {
                task: TaskSpec::new(Pid(9), "later"),
                from: Pid(12),
                request_id: RequestId(77),
            },
        ] {
            let request = Request {
                from_node: "a".into(),
                epoch: 2,
                op,
            };
            assert_eq!(decode_request(&encode(&request)), Ok(request));
        }
        // A delegation must say who asked, and as which request.
        let refused = decode_request(
            br#"{"from_node":"a","epoch":2,"op":"delegate","args":{"task":{"to":9,"description":"x","params":{}}}}"#,
        );
        assert!(
            matches!(&refused, Err(r) if r.kind == ErrorKind::InvalidArgument
                && r.message.contains("missing field `from`")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_get_answer_is_cut_to_its_byte_budget_and_names_the_rest() {
        let info = |pid: u64, bytes: usize| {
            let mut info: ProcessInfo = serde_json::from_value(serde_json::json!({
                "pid": pid, "ppid": 1, "name": "w", "role": "worker", "tier": "operational",
                "state": "idle", "model": "", "runtime": "echo", "tools": [],
                "limits": {"max_children": 1, "max_depth": 1, "timeout_seconds": 1, "max_concurrent_tasks": 1},
                "depth": 1, "children": 0, "mailbox_len": 0, "started_at_unix_ms": 0,
                "metadata": {}, "usage": serde_json::to_value(hivekernel_agents::LlmUsage::default()).unwrap_or_default(),
                "exit": null,
                "restart": serde_json::to_value(hivekernel_agents::RestartSpec::default()).unwrap_or_default()
            }))
            .unwrap_or_else(|err| panic!("{err}"));
            info.metadata.insert("k".into(), "x".repeat(bytes));
            Some(info)
        };
        let asked: Vec<Pid> = (10..15).map(Pid).collect();
        // 5 of 300 KiB each, one not held: two fit, the rest is named.
        let found = vec![
            info(10, 300 << 10),
            None,
            info(12, 300 << 10),
            info(13, 300 << 10),
            info(14, 10),
        ];
        let got = Got::cut(&asked, found);
        let pids: Vec<u64> = got.processes.iter().map(|p| p.pid.0).collect();
        assert_eq!(pids, [10, 12]);
        assert_eq!(got.rest, [Pid(13), Pid(14)]);
        // One alone larger than the budget still goes, alone.
        let got = Got::cut(&asked[..1], vec![info(10, 900 << 10)]);
        assert_eq!((got.processes.len(), got.rest.len()), (1, 0));
    }

    #[test]
    fn bad_requests_and_answers_say_what_is_wrong() {
        let refused = decode_request(br#"{"from_node":"a","epoch":1,"op":"fly"}"#);
        assert!(
            matches!(&refused, Err(r) if r.kind == ErrorKind::InvalidArgument
                && r.message.contains("unknown variant `fly`")),
            "{refused:?}"
        );
        let answer: Result<Got, _> = decode_answer(
            "b",
            b"{\"error\":{\"kind\":\"not_found\",\"message\":\"process 9 not found\"}}",
        );
        assert_eq!(
            answer,
            Err(Refusal {
                kind: ErrorKind::NotFound,
                message: "process 9 not found".into()
            })
        );
        let garbled: Result<Got, _> = decode_answer("b", b"{\"ok\":[1,");
        assert!(
            matches!(&garbled, Err(r) if r.kind == ErrorKind::Internal && r.message.contains("node b")),
            "{garbled:?}"
        );
    }
}
