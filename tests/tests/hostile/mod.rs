//! Hostile input against the real parts: a real kernel, its gRPC server on
//! loopback, real files, real processes. Each case asserts the refusal (an
//! error that says what was wrong) and that nothing changed.
//!
//! Path traversal, symlink escapes and the sentinel directory are in
//! `workspace_tools.rs`, the SSRF cases in `web_fetch.rs`, beside the tools'
//! other tests; what is here needs `/proc`, a gRPC server, or many shapes
//! of input at once. The cases that measure or kill the kernel itself (its
//! RSS, its file descriptors, `kill -9`) run the real binary, in
//! `kernel/tests/hostile.rs`.
//!
//! # Layout
//! - `shell`: `shell_exec` timeouts, floods, escapes from the sandbox and
//!   processes left behind, checked in `/proc`, in memory and on disk (the
//!   flood in a test process of its own, so its peak memory is the
//!   flood's alone).
//! - `config`: malformed startup configs through the parser and `hivekernel start`.
//! - `approval`: approval globs against calls that change only case.
//! - `child_models`: a model name a process makes up for its child.
//! - `cluster_auth`: who may join a cluster's NATS: credentials against a
//!   real `nats-server`, wrong ones refused unquoted, an open server refused.
//! - `cluster_forgery`: what a holder of the cluster's NATS credentials
//!   without its secret publishes (an operation, a replayed one, a loss
//!   claim, an event) is refused by real nodes.
//! - `dashboard`: a stolen session cookie, a page on another port or
//!   host name, logins that would crowd out the operator's session (the
//!   browser case in Chromium).
//! - `grpc`: malformed gRPC arguments, and mailbox floods (by count, by bytes) over gRPC.
//! - `memory`: what the kernel keeps of floods of large texts, measured on the real binary.
//! - `tool_args`: every built-in tool given arguments of the wrong shape.
//! - `model`: a model endpoint that answers without end (an endless stream
//!   of tool-call arguments, an endless body), with 5,000 tool calls, and
//!   an MCP server listing megabytes of tools.
//! - `skills`: a saved skill as a way into every agent's prompt: a
//!   `global` one waits for a person, and prompts fence what agents wrote.
//! - `storage`: filling the disk with one process token: a subtree's
//!   quota holds after its children exit, the store's ceiling holds, and
//!   deleted data gives its space back.
//! - `props`: property tests: config, cron and tool arguments never panic.

#![allow(clippy::unwrap_used)]

mod approval;
mod child_models;
mod cluster_auth;
mod cluster_forgery;
mod config;
mod dashboard;
mod grpc;
mod memory;
mod model;
mod props;
mod shell;
mod skills;
mod storage;
mod tool_args;
