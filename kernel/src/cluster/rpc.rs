//! Requests between nodes: JSON over NATS request/reply on
//! `hk.node.<node>.rpc` (docs/CLUSTER.md, "Messages between nodes").
//! A request names its sender and the sender's epoch; an answer is
//! `{"ok": ...}` or `{"error": {"kind", "message"}}` with the class of
//! error the operation would have given locally, so a caller sees the
//! same error whichever node it reached.

use bytes::Bytes;
use hivekernel_agents::{ErrorKind, Pid, ProcessInfo};
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
}

/// What [`Op::Get`] answers.
pub type Got = Vec<ProcessInfo>;

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
        let garbled: Result<Got, _> = decode_answer("b", b"[1,");
        assert!(
            matches!(&garbled, Err(r) if r.kind == ErrorKind::Internal && r.message.contains("node b")),
            "{garbled:?}"
        );
    }
}
