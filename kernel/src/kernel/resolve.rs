//! Names as addresses: a PID, a unique process name (`queen`), or a path of
//! names from PID 1 (`queen/queen-w1`).

use hivekernel_agents::Pid;

use crate::error::{KernelError, Result};
use crate::kernel::Kernel;
use crate::process::ProcessTable;

/// Longest name or path looked up.
const MAX_TARGET_BYTES: usize = 4096;
/// Candidates an ambiguous name lists.
const MAX_CANDIDATES: usize = 10;

impl Kernel {
    /// The process `target` names: digits are a PID (which must exist);
    /// `a/b/c` walks names down from PID 1's children; anything else is a
    /// process name, which must be unique (a name shared by one live process
    /// and zombies means the live one). Unknown: NOT_FOUND naming it;
    /// ambiguous: INVALID_ARGUMENT listing the candidates with their PIDs.
    pub fn find_process(&self, target: &str) -> Result<Pid> {
        if target.len() > MAX_TARGET_BYTES {
            return Err(KernelError::InvalidArgument(format!(
                "target is {} bytes, at most {MAX_TARGET_BYTES}",
                target.len()
            )));
        }
        let table = self.inner.table().read();
        let target = target.trim();
        if let Ok(pid) = target.parse::<u64>() {
            let pid = Pid(pid);
            return table
                .get(pid)
                .map(|_| pid)
                .ok_or(KernelError::NotFound(pid));
        }
        if target.is_empty() {
            return Err(KernelError::InvalidArgument(
                "a process is named by its PID, its name or a path of names from PID 1; got nothing"
                    .into(),
            ));
        }
        match target.strip_prefix('/').unwrap_or(target).split_once('/') {
            Some(_) => by_path(&table, target),
            None => by_name(&table, target),
        }
    }
}

fn by_name(table: &ProcessTable, name: &str) -> Result<Pid> {
    let mut found: Vec<Pid> = table
        .iter()
        .filter(|(_, entry)| &*entry.proc.ctx.name == name)
        .map(|(pid, _)| pid)
        .collect();
    found.sort_unstable();
    let alive: Vec<Pid> = found
        .iter()
        .copied()
        .filter(|pid| table.get(*pid).is_some_and(|entry| entry.is_alive()))
        .collect();
    match (found.as_slice(), alive.as_slice()) {
        ([], _) => Err(KernelError::NoSuchName(format!(
            "no process named {:?}",
            shown(name)
        ))),
        ([pid], _) | (_, [pid]) => Ok(*pid),
        _ => Err(ambiguous(table, name, &found)),
    }
}

fn by_path(table: &ProcessTable, path: &str) -> Result<Pid> {
    let mut at = Pid::KERNEL;
    for (depth, part) in path.trim_start_matches('/').split('/').enumerate() {
        let entry = table.get(at).ok_or(KernelError::NotFound(at))?;
        let named: Vec<Pid> = entry
            .children
            .iter()
            .filter(|child| table.get(*child).is_some_and(|c| &*c.proc.ctx.name == part))
            .collect();
        at = match named.as_slice() {
            [pid] => *pid,
            [] => {
                let walked: Vec<&str> = path
                    .trim_start_matches('/')
                    .split('/')
                    .take(depth)
                    .collect();
                let under = match walked.as_slice() {
                    [] => "PID 1".to_owned(),
                    parts => format!("{} ({at})", parts.join("/")),
                };
                return Err(KernelError::NoSuchName(format!(
                    "no process at {:?}: no child named {:?} under {under}",
                    shown(path),
                    shown(part)
                )));
            }
            several => return Err(ambiguous(table, path, several)),
        };
    }
    Ok(at)
}

/// The refusal of a name several processes answer to, listing them.
fn ambiguous(table: &ProcessTable, name: &str, pids: &[Pid]) -> KernelError {
    let listed: Vec<String> = pids
        .iter()
        .take(MAX_CANDIDATES)
        .map(|pid| format!("{pid} ({})", path_of(table, *pid)))
        .collect();
    let more = pids.len().saturating_sub(MAX_CANDIDATES);
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    KernelError::InvalidArgument(format!(
        "{:?} names {} processes: {}{tail}; use a PID or a path from PID 1",
        shown(name),
        pids.len(),
        listed.join(", ")
    ))
}

/// A name as an error quotes it: cut to a safe size.
fn shown(name: &str) -> &str {
    hivekernel_agents::text::prefix(name, 128)
}

/// `queen/worker`: the names from PID 1's child down to `pid`.
pub(crate) fn path_of(table: &ProcessTable, pid: Pid) -> String {
    let mut names = Vec::new();
    let mut at = pid;
    while let Some(entry) = table.get(at) {
        if at == Pid::KERNEL {
            break;
        }
        names.push(entry.proc.ctx.name.to_string());
        at = entry.ppid;
    }
    names.reverse();
    names.join("/")
}
