//! The process tree as this kernel sees it: its own table and, on a node
//! of a cluster, the other live nodes' processes as the directory lists
//! them. PID 1 is every node's kernel, so its children are the union of
//! every node's.

use hivekernel_agents::Pid;

use crate::cluster::{Listing, Listings};
use crate::process::ProcessTable;
use crate::router::{Lineage, Link};

impl super::Kernel {
    /// `pid`'s line from PID 1; just `pid` when it is gone from the table.
    pub(super) fn lineage_of(&self, pid: Pid) -> Vec<Pid> {
        self.inner
            .table()
            .read()
            .lineage(pid)
            .unwrap_or_else(|| vec![pid])
    }
}

/// One read of the tree: hold it briefly (it holds the table's read lock
/// and the directory mirror's).
pub(super) struct Tree<'a> {
    table: &'a ProcessTable,
    others: Option<Listings<'a>>,
    /// A listing read from the directory itself, newer than the mirror.
    fresh: Option<(Pid, Listing)>,
}

impl<'a> Tree<'a> {
    pub(super) fn new(table: &'a ProcessTable, others: Option<Listings<'a>>) -> Self {
        Tree {
            table,
            others,
            fresh: None,
        }
    }

    /// The tree with `pid`'s listing, read from the directory because the
    /// mirror did not have it yet.
    pub(super) fn with_fresh(mut self, pid: Pid, listing: Listing) -> Self {
        self.fresh = Some((pid, listing));
        self
    }

    /// Whether `pid` is in the tree, live or a zombie.
    pub(super) fn contains(&self, pid: Pid) -> bool {
        self.table.get(pid).is_some() || self.listed(pid)
    }

    fn listed(&self, pid: Pid) -> bool {
        self.others
            .as_ref()
            .is_some_and(|others| others.get(pid).is_some())
    }

    /// `pid`'s name, parent and whether it is alive.
    pub(super) fn get(&self, pid: Pid) -> Option<(&str, Pid, bool)> {
        if let Some(entry) = self.table.get(pid) {
            return Some((&entry.proc.ctx.name, entry.ppid, entry.is_alive()));
        }
        let listing = self.others.as_ref()?.get(pid)?;
        Some((&listing.name, listing.ppid, !listing.exited))
    }

    /// `pid`'s children wherever they live, in PID order.
    pub(super) fn children(&self, pid: Pid) -> Vec<Pid> {
        let entry = self.table.get(pid);
        let mut children: Vec<Pid> = match entry {
            Some(entry) => entry.children.iter().collect(),
            // A parent on another node, with children here.
            None => self.table.foreign_children(pid).collect(),
        };
        if let Some(others) = &self.others {
            let before = children.len();
            // A listing naming a PID this node holds is not believed; a
            // child of a process here on another node is its child already.
            children.extend(others.children(pid).filter(|child| {
                self.table.get(*child).is_none()
                    && !entry.is_some_and(|entry| entry.children.contains(*child))
            }));
            if before > 0 && children.len() > before {
                children.sort_unstable();
            }
        }
        children
    }

    /// Every process with its name and whether it is alive.
    pub(super) fn named(&self) -> impl Iterator<Item = (Pid, &str, bool)> + '_ {
        let local = self
            .table
            .iter()
            .map(|(pid, entry)| (pid, &*entry.proc.ctx.name, entry.is_alive()));
        let others = self.others.iter().flat_map(|others| {
            others
                .iter()
                .filter(|(pid, _)| self.table.get(*pid).is_none())
                .map(|(pid, listing)| (pid, listing.name.as_str(), !listing.exited))
        });
        local.chain(others)
    }

    /// `root` and everything below it, parents first (pre-order), at most
    /// `max_depth` levels below root.
    pub(super) fn subtree_preorder(&self, root: Pid, max_depth: Option<u32>) -> Vec<Pid> {
        let Some(others) = &self.others else {
            return self.table.subtree_preorder(root, max_depth);
        };
        let mut out = Vec::new();
        // Listings come from other nodes: a loop in them must not loop us.
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![(root, 0u32)];
        while let Some((pid, level)) = stack.pop() {
            if !seen.insert(pid) || (self.table.get(pid).is_none() && others.get(pid).is_none()) {
                continue;
            }
            out.push(pid);
            if max_depth.is_some_and(|max| level >= max) {
                continue;
            }
            for child in self.children(pid).into_iter().rev() {
                stack.push((child, level + 1));
            }
        }
        out
    }
}

impl Lineage for Tree<'_> {
    fn link(&self, pid: Pid) -> Option<Link> {
        if let Some(link) = self.table.link(pid) {
            return Some(link);
        }
        let listing = match &self.fresh {
            Some((fresh, listing)) if *fresh == pid => listing,
            _ => self.others.as_ref()?.get(pid)?,
        };
        Some(Link {
            ppid: listing.ppid,
            depth: listing.depth,
            alive: !listing.exited,
            role: listing.role,
        })
    }
}
