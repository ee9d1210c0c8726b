//! The `hivekernel` binary: parses the command line, sets up logging, runs
//! the command and exits with its code (see [`hivekernel_kernel::cli`]).

use std::io::IsTerminal;

use clap::Parser;
use hivekernel_kernel::cli::{self, Cli};
use tracing_subscriber::EnvFilter;

/// What is logged unless `RUST_LOG` says otherwise: the kernel at info; the
/// MCP SDK only when something goes wrong (its info lines narrate every
/// session, which the kernel already reports as `mcp_server` events).
const DEFAULT_LOG: &str = "info,rmcp=warn";

#[global_allocator]
static ALLOCATOR: hivekernel_kernel::Allocator = hivekernel_kernel::Allocator;

fn main() {
    // Started as the sandbox helper: that, before any thread exists.
    if let Some(code) = hivekernel_agents::sandbox::helper::dispatch() {
        std::process::exit(code);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let code = match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            1
        }
    };
    std::process::exit(code);
}

async fn run() -> i32 {
    let args = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match cli::run(args).await {
        Ok(()) => 0,
        Err(err) => {
            err.report();
            err.exit_code()
        }
    }
}
