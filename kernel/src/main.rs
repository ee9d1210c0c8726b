//! The `hivekernel` binary: parses the command line, sets up logging, runs
//! the command and exits with its code (see [`hivekernel_kernel::cli`]).

use std::io::IsTerminal;

use clap::Parser;
use hivekernel_kernel::cli::{self, Cli};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOCATOR: hivekernel_kernel::Allocator = hivekernel_kernel::Allocator;

#[tokio::main]
async fn main() {
    let args = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let code = match cli::run(args).await {
        Ok(()) => 0,
        Err(err) => {
            err.report();
            err.exit_code()
        }
    };
    std::process::exit(code);
}
