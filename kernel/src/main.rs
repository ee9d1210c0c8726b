//! The `hivekernel` binary: parses the command line, sets up logging, runs
//! the command and exits with its code (see [`hivekernel_kernel::cli`]).

use clap::Parser;
use hivekernel_kernel::cli::{self, Cli};

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
    hivekernel_kernel::logging::init(&args);
    match cli::run(args).await {
        Ok(()) => 0,
        Err(err) => {
            err.report();
            err.exit_code()
        }
    }
}
