//! The end-to-end suite, one test binary with a module per area: real
//! kernels, their gRPC servers on loopback, real files and processes, and
//! the real peers each area names (NATS, MCP servers, Prometheus,
//! Chromium), and the hostile-input suite (`hostile/`). One binary links
//! the kernel once. The real-model tests (`with_llama.rs`) are a binary of
//! their own: their model server takes every core while it answers.
//!
//! Run one area with a filter: `cargo test --release -p hivekernel-tests
//! --test suite cluster::`.

mod access;
mod artifacts;
mod backup;
mod calibration;
mod cluster;
mod cron;
mod dashboard;
mod durable;
mod exec;
mod governance;
mod grpc;
mod hostile;
mod inbox;
mod llm;
mod mcp;
mod memory;
mod messaging;
mod metrics;
mod models;
mod nats_harness;
mod otel;
mod process_tools;
mod process_tree;
mod service;
mod skills;
mod streaming;
mod supervision;
mod templates;
mod tool_agent;
mod traces;
mod transcripts;
mod tree_invariants;
mod usage;
mod web_fetch;
mod workspace_tools;
