//! Cron: schedules that run tasks, spawn short-lived agents or drop messages.
//!
//! An entry names a schedule (`crontab.rs`: 5-field crontab, or 6/7 fields with
//! seconds), an action, a target process and a text. Entries come from the
//! config (`agents[].cron`, owned by that agent) and from the API (gRPC, the
//! CLI, the cron tools), and all of them are kept in the store with their
//! run history.
//!
//! Firing is at most once: the fire time is committed to the store before
//! the action starts, so a crash between the two never fires the same slot
//! twice. After downtime, a slot that passed is skipped, or run once when
//! the entry's `missed` policy is `run_once`. With `overlap: skip` (the
//! default) a slot that comes while the previous run is still going is
//! recorded as skipped.
//!
//! The kernel's cron is reached through [`Kernel::cron`], a handle whose
//! methods are cron's whole API; its state ([`Cron`]) is private to this
//! module.
//!
//! Layout: `schedule` (the entries and the timer
//! task), `run` (the actions), `elsewhere` (entries on other nodes).

use hivekernel_agents::Pid;

use crate::crontab;
use crate::kernel::Kernel;

mod elsewhere;
mod run;
mod schedule;

pub use hivekernel_agents::cron::{
    CronAction, CronInfo, CronRun, CronSource, CronSpec, HISTORY, Missed, OUTPUT_PREVIEW, Overlap,
};
pub use run::CRON_MESSAGE;
pub(crate) use schedule::Cron;
pub use schedule::{MAX_CRON_NAME_BYTES, MAX_CRON_PER_PROCESS};

/// Cron through the kernel ([`Kernel::cron`]): adding, changing, listing
/// and running entries, and what the kernel's start, reloads and moves of
/// processes ask of it.
#[derive(Debug, Clone, Copy)]
pub struct CronHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's cron.
    pub fn cron(&self) -> CronHandle<'_> {
        CronHandle { kernel: self }
    }
}

/// The first time `expression` fires strictly after `after_ms` (Unix ms),
/// `None` when it never fires again; or why the expression is refused, as
/// the config check and [`CronHandle::add`] say it.
pub fn next_fire(expression: &str, after_ms: u64) -> Result<Option<u64>, String> {
    crontab::parse(expression).map(|schedule| crontab::next_after(&schedule, after_ms))
}

/// A config agent's cron entries as the kernel takes them at start and at a
/// reload: `(owner, spec)`, each aimed at the agent, `pid`.
pub(crate) fn declared(
    pid: Pid,
    entries: &[CronSpec],
) -> impl Iterator<Item = (Pid, CronSpec)> + '_ {
    entries.iter().map(move |entry| {
        let mut entry = entry.clone();
        entry.target = pid;
        (pid, entry)
    })
}
