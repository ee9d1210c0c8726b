//! A small HiveKernel client: what any Rust program needs to drive the
//! kernel over gRPC with tonic and the generated `hivekernel-proto` stubs.
//!
//! ```sh
//! cargo run -p hivekernel-client-example -- spawn --name e --runtime echo
//! cargo run -p hivekernel-client-example -- spawn --name py -- python3 /abs/path/echo_agent.py
//! cargo run -p hivekernel-client-example -- tree
//! cargo run -p hivekernel-client-example -- exec 2 "hello"
//! ```
//!
//! The address and token come from `--addr` / `--token`, then
//! `HIVEKERNEL_ADDR` / `HIVEKERNEL_TOKEN`, then the kernel's data directory
//! (`--data-dir`, default `.hivekernel`: `kernel.addr` and `admin.token`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hivekernel_proto::v1::kernel_client::KernelClient;
use hivekernel_proto::v1::{
    ExecuteTaskRequest, ListProcessesRequest, ProcessInfo, ProcessState, SpawnRequest,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::Endpoint;
use tonic::{Request, Status};

#[derive(Debug, Parser)]
#[command(about = "A small HiveKernel client: spawn, tree, exec")]
struct Args {
    /// Kernel address, host:port or URL.
    #[arg(long, env = "HIVEKERNEL_ADDR")]
    addr: Option<String>,
    /// Bearer token.
    #[arg(long, env = "HIVEKERNEL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The kernel's data directory (kernel.addr, admin.token).
    #[arg(long, default_value = ".hivekernel")]
    data_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Spawn a process; prints its PID. A command after `--` makes it an exec process.
    Spawn {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 1)]
        parent: u64,
        /// Runtime [default: exec with a command, else the kernel's default].
        #[arg(long, default_value = "")]
        runtime: String,
        /// The OS command of an exec process.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Print the process tree.
    Tree,
    /// Run a task and print its output.
    Exec { pid: u64, text: String },
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let addr = address(args.addr, &args.data_dir);
    let token = token(args.token, &args.data_dir)?;
    let channel = Endpoint::from_shared(addr.clone())?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    let bearer = Bearer(format!("Bearer {token}").parse()?);
    let mut kernel = KernelClient::with_interceptor(channel, bearer);

    match args.command {
        Command::Spawn {
            name,
            parent,
            runtime,
            command,
        } => {
            let request = SpawnRequest {
                parent,
                name,
                runtime,
                command,
                ..SpawnRequest::default()
            };
            let pid = kernel.spawn(request).await?.into_inner().pid;
            println!("{pid}");
        }
        Command::Tree => {
            let mut stream = kernel
                .list_processes(ListProcessesRequest::default())
                .await?
                .into_inner();
            let mut procs = Vec::new();
            while let Some(batch) = stream.message().await? {
                procs.extend(batch.processes);
            }
            print!("{}", tree(&procs));
        }
        Command::Exec { pid, text } => {
            let request = ExecuteTaskRequest {
                pid,
                description: text,
                ..ExecuteTaskRequest::default()
            };
            let reply = kernel.execute_task(request).await?.into_inner();
            if !reply.success {
                bail!("task failed: {}", reply.error);
            }
            println!("{}", reply.output);
        }
    }
    Ok(())
}

/// `--addr`, else `<data_dir>/kernel.addr`, else the default; always a URL.
fn address(flag: Option<String>, data_dir: &Path) -> String {
    let addr = flag
        .or_else(|| std::fs::read_to_string(data_dir.join("kernel.addr")).ok())
        .map(|addr| addr.trim().to_owned())
        .unwrap_or_else(|| "127.0.0.1:50051".to_owned());
    if addr.contains("://") {
        addr
    } else {
        format!("http://{addr}")
    }
}

/// `--token`, else `<data_dir>/admin.token`.
fn token(flag: Option<String>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(token) = flag {
        return Ok(token.trim().to_owned());
    }
    let path = data_dir.join("admin.token");
    let token = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no token: pass --token or point --data-dir at the kernel's data directory ({})",
            path.display()
        )
    })?;
    Ok(token.trim().to_owned())
}

/// One line per process, children indented under their parent.
fn tree(procs: &[ProcessInfo]) -> String {
    let mut children: BTreeMap<u64, Vec<&ProcessInfo>> = BTreeMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let known: Vec<u64> = procs.iter().map(|p| p.pid).collect();
    let mut out = String::new();
    let mut stack: Vec<(&ProcessInfo, usize)> = procs
        .iter()
        .filter(|p| !known.contains(&p.ppid))
        .rev()
        .map(|p| (p, 0))
        .collect();
    while let Some((p, depth)) = stack.pop() {
        let state = ProcessState::try_from(p.state)
            .map(|s| {
                s.as_str_name()
                    .trim_start_matches("PROCESS_STATE_")
                    .to_lowercase()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "{}{} ({}) {} {state}\n",
            "  ".repeat(depth),
            p.name,
            p.pid,
            p.runtime
        ));
        if let Some(kids) = children.get(&p.pid) {
            stack.extend(kids.iter().rev().map(|kid| (*kid, depth + 1)));
        }
    }
    out
}
