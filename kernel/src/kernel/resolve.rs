//! Names as addresses: a PID, a unique process name (`queen`), or a path of
//! names from PID 1 (`queen/queen-w1`).

use hivekernel_agents::Pid;

use crate::error::{KernelError, Result};
use crate::kernel::Kernel;
use crate::kernel::tree::Tree;

/// Longest name or path looked up.
const MAX_TARGET_BYTES: usize = 4096;
/// Candidates an ambiguous name lists.
const MAX_CANDIDATES: usize = 10;
/// Most names a path shown in an error holds.
const MAX_PATH_NAMES: usize = 64;

impl Kernel {
    /// The process `target` names: digits are a PID (which must exist);
    /// `a/b/c` walks names down from PID 1's children; anything else is a
    /// process name, which must be unique (a name shared by one live process
    /// and zombies means the live one). Unknown: NOT_FOUND naming it;
    /// ambiguous: INVALID_ARGUMENT listing the candidates with their PIDs.
    /// On a node of a cluster, names and paths are looked up across every
    /// live node.
    pub async fn find_process(&self, target: &str) -> Result<Pid> {
        if target.len() > MAX_TARGET_BYTES {
            return Err(KernelError::InvalidArgument(format!(
                "target is {} bytes, at most {MAX_TARGET_BYTES}",
                target.len()
            )));
        }
        let target = target.trim();
        if let Ok(pid) = target.parse::<u64>() {
            let pid = Pid(pid);
            return match self.node().holder(pid).await? {
                Some(_) => Ok(pid),
                None => Err(KernelError::NotFound(pid)),
            };
        }
        if target.is_empty() {
            return Err(KernelError::InvalidArgument(
                "a process is named by its PID, its name or a path of names from PID 1; got nothing"
                    .into(),
            ));
        }
        let table = self.inner.table().read();
        let tree = Tree::new(&table, self.inner.cluster().map(|c| c.listings()));
        match target.strip_prefix('/').unwrap_or(target).split_once('/') {
            Some(_) => by_path(&tree, target),
            None => by_name(&tree, target),
        }
    }
}

fn by_name(tree: &Tree<'_>, name: &str) -> Result<Pid> {
    let mut found: Vec<(Pid, bool)> = tree
        .named()
        .filter(|(_, named, _)| *named == name)
        .map(|(pid, _, alive)| (pid, alive))
        .collect();
    found.sort_unstable();
    let alive: Vec<Pid> = found
        .iter()
        .filter(|(_, alive)| *alive)
        .map(|(pid, _)| *pid)
        .collect();
    let found: Vec<Pid> = found.into_iter().map(|(pid, _)| pid).collect();
    match (found.as_slice(), alive.as_slice()) {
        ([], _) => Err(KernelError::NoSuchName(format!(
            "no process named {:?}",
            shown(name)
        ))),
        ([pid], _) | (_, [pid]) => Ok(*pid),
        _ => Err(ambiguous(tree, name, &found)),
    }
}

fn by_path(tree: &Tree<'_>, path: &str) -> Result<Pid> {
    let mut at = Pid::KERNEL;
    for (depth, part) in path.trim_start_matches('/').split('/').enumerate() {
        if !tree.contains(at) {
            return Err(KernelError::NotFound(at));
        }
        let named: Vec<Pid> = tree
            .children(at)
            .into_iter()
            .filter(|child| tree.get(*child).is_some_and(|(name, _, _)| name == part))
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
            several => return Err(ambiguous(tree, path, several)),
        };
    }
    Ok(at)
}

/// The refusal of a name several processes answer to, listing them.
fn ambiguous(tree: &Tree<'_>, name: &str, pids: &[Pid]) -> KernelError {
    let listed: Vec<String> = pids
        .iter()
        .take(MAX_CANDIDATES)
        .map(|pid| format!("{pid} ({})", path_of(tree, *pid)))
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
fn path_of(tree: &Tree<'_>, pid: Pid) -> String {
    let mut names = Vec::new();
    let mut at = pid;
    // Bounded: listings come from other nodes, and must not loop us.
    while let Some((name, ppid, _)) = tree.get(at) {
        if at == Pid::KERNEL || names.len() >= MAX_PATH_NAMES {
            break;
        }
        names.push(name.to_owned());
        at = ppid;
    }
    names.reverse();
    names.join("/")
}
