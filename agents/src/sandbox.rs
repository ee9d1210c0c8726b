//! Confinement for the commands the kernel runs for agents: `shell_exec`
//! commands always, `exec` agents when config asks.
//!
//! A confined command is started through a small helper, the kernel's own
//! executable run again in a helper mode (see [`helper`]), so that nothing
//! here needs `unsafe` code between `fork` and `exec`:
//!
//! ```text
//! kernel ──> helper (outside) ──> helper (init) ──> the command ──> ...
//!            new PID namespace    PID 1 there      own /proc, Landlock,
//!                                                  no capabilities
//! ```
//!
//! - **The outside helper** makes a new PID namespace (as root; otherwise in
//!   a new user namespace that maps the kernel's user to itself; when
//!   neither is allowed it falls back to being a child subreaper), starts
//!   the init helper in it, waits for it, and exits the way the command did.
//!   In a user namespace it hands `CAP_SYS_ADMIN` there on to the init
//!   helper (an ambient capability), which needs it to mount `/proc`.
//!   With a lifeline (`shell_exec`), the kernel holds the helper's stdin: when
//!   it closes, because the call timed out or was cancelled or the kernel
//!   died, the helper kills the init helper and with it everything.
//! - **The init helper** is PID 1 of the namespace. It makes a mount
//!   namespace of its own (every mount private, so nothing mounted there
//!   reaches the host) and mounts a fresh procfs on `/proc`: the command
//!   sees the processes of its namespace only, not the host's and their
//!   command lines. Then it confines itself with Landlock, drops every
//!   capability (bounding set included, so a kernel running as root hands
//!   none on), starts the command and reaps orphans.
//!   When the command exits, the init helper exits, and the Linux kernel
//!   kills every process left in the namespace: a `setsid`, a double fork or
//!   a daemon cannot outlive the command. Without a namespace the helpers
//!   are child subreapers and kill what was reparented to them instead.
//!
//! A host that cannot give a command a `/proc` of its own (no namespaces,
//! or procfs cannot be mounted in them, as in some containers) falls short
//! the way a host without Landlock does ([`Support::shortfall`]): the
//! callers refuse to run commands there unless config accepts it, rather
//! than let them read every process's command line, where a token given
//! as an argument would be. A warning in the log would not reach the
//! operator before an agent had read the token.
//!
//! Both helpers shrug off SIGTERM, SIGINT and SIGHUP, so that a stop sent to
//! the process group reaches the command and leaves it its grace time;
//! SIGKILL ends all of it.
//!
//! What Landlock allows is a [`Policy`]: read (and execute) beneath the
//! system paths ([`SYSTEM_READ_ONLY`]) and a few device files, read and
//! write beneath the command's own directories, nothing else. `hidden`
//! paths (the kernel's data directory, the root of the workspaces) stay out
//! of reach even when a broader grant contains them: that grant is replaced
//! by grants on its other entries.

pub mod helper;
mod rules;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};

pub use rules::{SYSTEM_READ_ONLY, SYSTEM_READ_WRITE, absolute};

/// What a confined command may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Confine with Landlock; `false` keeps only the process containment.
    pub landlock: bool,
    /// Readable and executable, with everything beneath.
    pub read_only: Vec<PathBuf>,
    /// Readable, writable and executable, with everything beneath.
    pub read_write: Vec<PathBuf>,
    /// Never reachable: a grant at or inside one is dropped, a grant that
    /// contains one is cut around it (the kernel's data directory).
    pub forbidden: Vec<PathBuf>,
    /// Cut out of the grants that contain them; a grant at or inside one is
    /// kept, since it was given on purpose (the root of the workspaces,
    /// with the command's own workspace inside).
    pub hidden: Vec<PathBuf>,
    /// End the command when the helper's stdin reaches its end.
    pub lifeline: bool,
    /// Mount a `/proc` of the command's own PID namespace, in a mount
    /// namespace of its own; the command does not start when that fails.
    pub own_proc: bool,
}

impl Policy {
    /// Landlock on, a `/proc` of the command's own, the system paths
    /// read-only, `own` read-write, what `keep_out` names kept out. Every path is made absolute here, against
    /// the kernel's directory, since the helper runs in another.
    pub fn confined(own: &[&Path], extra: &Grants, keep_out: &KeepOut) -> Policy {
        fn all<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Vec<PathBuf> {
            paths.into_iter().map(absolute).collect()
        }
        let extra_ro = extra.read_only.iter().map(PathBuf::as_path);
        let extra_rw = extra.read_write.iter().map(PathBuf::as_path);
        Policy {
            landlock: true,
            read_only: all(SYSTEM_READ_ONLY.iter().map(Path::new).chain(extra_ro)),
            read_write: all(SYSTEM_READ_WRITE
                .iter()
                .map(Path::new)
                .chain(own.iter().copied())
                .chain(extra_rw)),
            forbidden: all(keep_out.forbidden.iter().map(PathBuf::as_path)),
            hidden: all(keep_out.hidden.iter().map(PathBuf::as_path)),
            lifeline: false,
            own_proc: true,
        }
    }
}

/// What commands must not reach, whatever they are granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeepOut {
    /// Nothing at or under these (the kernel's data directory).
    pub forbidden: Vec<PathBuf>,
    /// Cut out of grants around them (the root of the workspaces).
    pub hidden: Vec<PathBuf>,
}

/// Paths config grants on top of the system ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Readable and executable.
    pub read_only: Vec<PathBuf>,
    /// Readable and writable.
    pub read_write: Vec<PathBuf>,
}

/// What confinement this host gives, as the helper found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Support {
    /// `None`: Landlock is not available (not built in or not enabled);
    /// else how much of the requested confinement the kernel enforces
    /// (`fully enforced` or `partially enforced`).
    pub landlock: Option<String>,
    /// How commands are kept from outliving their call.
    pub containment: Containment,
    /// Landlock keeps commands from signalling processes outside their
    /// sandbox (Linux 6.12+).
    pub signal_scoping: bool,
    /// Commands get a `/proc` of their own PID namespace (a namespace, and
    /// procfs mountable in it), not the host's.
    pub own_proc: bool,
}

impl Support {
    /// Why commands cannot be confined here, if they cannot.
    pub fn shortfall(&self) -> Option<&'static str> {
        if self.landlock.is_none() {
            return Some(
                "this host has no Landlock (Linux 5.13+ with landlock among the LSMs enabled \
                 at boot), so a command could read the kernel's data directory",
            );
        }
        if self.containment == Containment::Subreaper && !self.signal_scoping {
            return Some(
                "this host gives neither a PID namespace (not root, user namespaces disabled) \
                 nor Landlock signal scoping (Linux 6.12+), so a command could signal the kernel",
            );
        }
        if !self.own_proc {
            return Some(
                "this host cannot give a command a /proc of its own (that needs a PID and a mount \
                 namespace, so root or user namespaces, and procfs mountable in them), so a \
                 command could read every process's command line, tokens given as arguments \
                 included",
            );
        }
        None
    }
}

/// How the helper keeps a command's processes together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Containment {
    /// A new PID namespace (the kernel runs as root).
    PidNamespace,
    /// A new user and PID namespace (unprivileged).
    UserNamespace,
    /// Child subreapers only: a process killed with its helper by SIGKILL
    /// (not by a timeout or a cancelled call) can leave orphans behind.
    Subreaper,
}

impl std::fmt::Display for Support {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.landlock {
            Some(level) => write!(f, "Landlock {level}")?,
            None => f.write_str("no Landlock")?,
        }
        f.write_str(match self.containment {
            Containment::PidNamespace => ", PID namespace",
            Containment::UserNamespace => ", user and PID namespace",
            Containment::Subreaper => ", child subreaper (no namespace)",
        })?;
        f.write_str(match self.own_proc {
            true => ", own /proc",
            false => ", the host's /proc",
        })?;
        if self.signal_scoping {
            f.write_str(", signal scoping")?;
        }
        Ok(())
    }
}

/// Starts commands through the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    helper: PathBuf,
}

impl Sandbox {
    /// Commands go through `helper`: an executable whose `main` starts with
    /// [`helper::dispatch`] (the `hivekernel` binary).
    pub fn new(helper: impl Into<PathBuf>) -> Sandbox {
        Sandbox {
            helper: helper.into(),
        }
    }

    /// The helper is the running executable, as `/proc/self/exe` (which
    /// stays the running binary even when its file is replaced by an upgrade).
    pub fn this_executable() -> Sandbox {
        Sandbox::new("/proc/self/exe")
    }

    /// The helper's path.
    pub fn helper(&self) -> &Path {
        &self.helper
    }

    /// A command that runs `program` (seen by itself as `argv0`) with `args`
    /// under `policy`. The caller sets its directory, environment, stdout
    /// and stderr; stdin is the lifeline when `policy.lifeline`, else null.
    pub fn command<I, S>(
        &self,
        policy: &Policy,
        program: &OsStr,
        argv0: &OsStr,
        args: I,
    ) -> Result<tokio::process::Command, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let policy =
            serde_json::to_string(policy).map_err(|err| format!("cannot encode policy: {err}"))?;
        let mut command = tokio::process::Command::new(&self.helper);
        command
            .arg(helper::OUTSIDE)
            .arg(policy)
            .arg(program)
            .arg(argv0)
            .args(args)
            .stdin(Stdio::null());
        Ok(command)
    }

    /// Asks the helper what this host supports (it tries, in a process of
    /// its own, what a confined command would get).
    pub async fn probe(&self) -> Result<Support, String> {
        let output = tokio::process::Command::new(&self.helper)
            .arg(helper::PROBE)
            .stdin(Stdio::null())
            .env_clear()
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|err| {
                format!(
                    "cannot run the sandbox helper {}: {err}",
                    self.helper.display()
                )
            })?;
        let text = String::from_utf8_lossy(&output.stdout);
        serde_json::from_str::<Support>(text.trim()).map_err(|_| {
            let said = format!(
                "{} {}",
                text.trim(),
                String::from_utf8_lossy(&output.stderr)
            );
            format!(
                "{} is not a sandbox helper: it answered the probe with {} ({})",
                self.helper.display(),
                output.status,
                crate::text::cut_str(said.trim(), 300)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_without_a_proc_of_the_commands_own_falls_short() {
        let mut support = Support {
            landlock: Some("fully enforced".to_owned()),
            containment: Containment::UserNamespace,
            signal_scoping: true,
            own_proc: true,
        };
        assert_eq!(support.shortfall(), None);
        assert_eq!(
            support.to_string(),
            "Landlock fully enforced, user and PID namespace, own /proc, signal scoping"
        );
        support.own_proc = false;
        let why = support.shortfall().unwrap_or_default();
        assert!(
            why.contains("/proc of its own") && why.contains("command line"),
            "{why}"
        );
        // Without a namespace there is none, whatever Landlock scopes.
        support.containment = Containment::Subreaper;
        assert!(support.shortfall().is_some());
        assert!(Policy::confined(&[], &Grants::default(), &KeepOut::default()).own_proc);
    }
}
