//! The binary's end-to-end tests, one test binary with a module per area
//! (one link of the kernel instead of one per area): `hivekernel start` in
//! a child process and the client commands run exactly as a user would
//! run them. Run one area with a filter: `cargo test --release -p
//! hivekernel-kernel --test binary restart::`.

mod support;

mod cli;
mod config;
mod hostile;
mod mcp_serve;
mod operator;
mod readme;
mod restart;
mod tls;
