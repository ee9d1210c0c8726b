//! The helper's side: what runs when the kernel's executable is started as
//! `hivekernel __sandbox POLICY PROGRAM ARGV0 [ARGS...]` (and, from there,
//! `__sandbox-init` with the same arguments, or `__sandbox-probe`, which
//! starts `__sandbox-probe-proc` in the namespace it made).
//!
//! Call [`dispatch`] first thing in `main`, before any thread is started:
//! a new user namespace can only be made by a single-threaded process.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};

use super::{Containment, Policy, Support, rules};

/// First argument of the outside helper.
pub const OUTSIDE: &str = "__sandbox";
/// First argument of the init helper.
pub const INIT: &str = "__sandbox-init";
/// First argument of the probe.
pub const PROBE: &str = "__sandbox-probe";
/// First argument of the probe's child, which tries to mount a `/proc` of
/// its own in the namespace the probe made.
const PROBE_PROC: &str = "__sandbox-probe-proc";
/// Exit code when the sandbox could not be set up (the command never ran).
pub const FAILED: i32 = 125;

/// The newest Landlock ABI asked for; older kernels enforce what they know.
const ABI_WANTED: ABI = ABI::V9;

/// Runs the helper mode the arguments name and returns its exit code, or
/// `None` when the executable was not started as a helper.
pub fn dispatch() -> Option<i32> {
    let mut args = std::env::args_os().skip(1);
    let mode = args.next()?;
    let outside = match mode.to_str()? {
        OUTSIDE => true,
        INIT => false,
        PROBE => return Some(probe()),
        PROBE_PROC => {
            return Some(match own_proc() {
                Ok(()) => 0,
                Err(problem) => fail(&problem),
            });
        }
        _ => return None,
    };
    let rest: Vec<OsString> = args.collect();
    Some(match Invocation::parse(rest) {
        Ok(invocation) if outside => run_outside(invocation),
        Ok(invocation) => run_init(invocation),
        Err(problem) => fail(&problem),
    })
}

/// The arguments after the mode.
struct Invocation {
    policy_text: OsString,
    policy: Policy,
    program: OsString,
    argv0: OsString,
    args: Vec<OsString>,
}

impl Invocation {
    fn parse(rest: Vec<OsString>) -> Result<Invocation, String> {
        let mut rest = rest.into_iter();
        let (Some(policy_text), Some(program), Some(argv0)) =
            (rest.next(), rest.next(), rest.next())
        else {
            return Err("usage: POLICY PROGRAM ARGV0 [ARGS...]".into());
        };
        let policy = policy_text
            .to_str()
            .ok_or_else(|| "the policy is not UTF-8".to_owned())
            .and_then(|text| {
                serde_json::from_str(text).map_err(|err| format!("bad policy: {err}"))
            })?;
        Ok(Invocation {
            policy_text,
            policy,
            program,
            argv0,
            args: rest.collect(),
        })
    }
}

/// How the command ended, as the init helper reports it to the outside one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Exit(i32),
    Signal(i32),
}

impl Ending {
    fn of(status: rustix::process::WaitStatus) -> Ending {
        match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => Ending::Exit(code),
            (None, Some(sig)) => Ending::Signal(sig),
            (None, None) => Ending::Exit(FAILED),
        }
    }

    fn of_std(status: std::process::ExitStatus) -> Ending {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Ending::Exit(code),
            (None, Some(sig)) => Ending::Signal(sig),
            (None, None) => Ending::Exit(FAILED),
        }
    }

    fn encode(self) -> String {
        match self {
            Ending::Exit(code) => format!("exit {code}"),
            Ending::Signal(sig) => format!("signal {sig}"),
        }
    }

    fn decode(text: &str) -> Option<Ending> {
        let (kind, number) = text.trim().split_once(' ')?;
        let number = number.parse().ok()?;
        match kind {
            "exit" if (0..=255).contains(&number) => Some(Ending::Exit(number)),
            "signal" if (1..=64).contains(&number) => Some(Ending::Signal(number)),
            _ => None,
        }
    }

    /// Ends this process the same way: the exit code, or death by the same
    /// signal (no core file); 128 + the signal if that signal does not kill.
    fn finish(self) -> i32 {
        match self {
            Ending::Exit(code) => code,
            Ending::Signal(sig) => {
                let none = rustix::process::Rlimit {
                    current: Some(0),
                    maximum: Some(0),
                };
                let _ = rustix::process::setrlimit(rustix::process::Resource::Core, none);
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                128 + sig
            }
        }
    }
}

fn fail(problem: &str) -> i32 {
    eprintln!("hivekernel sandbox: {problem}");
    FAILED
}

/// The outside helper: contain, start the init helper, wait, end the same way.
fn run_outside(invocation: Invocation) -> i32 {
    let containment = contain();
    hand_on_mount_capability(containment);
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    shield();
    let (mut report, report_writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(err) => return fail(&format!("cannot make a pipe: {err}")),
    };
    // This very binary, even if its file was replaced meanwhile.
    let mut init = std::process::Command::new("/proc/self/exe");
    init.arg(INIT)
        .arg(&invocation.policy_text)
        .arg(&invocation.program)
        .arg(&invocation.argv0)
        .args(&invocation.args)
        .stdin(Stdio::from(report_writer));
    let spawned = init.spawn();
    // Our copy of the report pipe's writing end goes with the builder, so
    // the pipe ends when the init helper does.
    drop(init);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return fail(&format!("cannot start the init helper: {err}")),
    };
    if invocation.policy.lifeline {
        let pidfd = Pid::from_raw(child.id() as i32).and_then(|pid| {
            rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
        });
        if let Some(pidfd) = pidfd {
            hold_lifeline(&pidfd);
        }
    }
    let own = child.wait().map(Ending::of_std);
    // Whatever the init helper wrote is there now; never wait for more (a
    // process that kept the pipe open must not hold this one up).
    let mut text = String::new();
    if rustix::io::ioctl_fionbio(&report, true).is_ok() {
        let mut bytes = [0u8; 64];
        if let Ok(n) = report.read(&mut bytes) {
            text = String::from_utf8_lossy(&bytes[..n]).into_owned();
        }
    }
    if containment == Containment::Subreaper {
        end_descendants();
    }
    match (Ending::decode(&text), own) {
        (Some(ending), _) | (None, Ok(ending)) => ending.finish(),
        (None, Err(err)) => fail(&format!("cannot wait for the init helper: {err}")),
    }
}

/// Returns when the process behind `pidfd` has exited; kills it when stdin
/// (the lifeline) reaches its end first. (No thread: after a new PID
/// namespace, this process can make none.)
fn hold_lifeline(pidfd: &std::os::fd::OwnedFd) {
    use rustix::event::{PollFd, PollFlags, poll};
    let stdin = std::io::stdin();
    let lifeline = stdin.as_fd();
    let mut holding = true;
    loop {
        let mut fds = [
            PollFd::new(pidfd, PollFlags::IN),
            PollFd::from_borrowed_fd(lifeline, PollFlags::IN),
        ];
        let watched = if holding { &mut fds[..] } else { &mut fds[..1] };
        match poll(watched, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return,
        }
        if !fds[0].revents().is_empty() {
            return;
        }
        if holding && !fds[1].revents().is_empty() {
            let mut sink = [0u8; 64];
            match rustix::io::read(lifeline, &mut sink) {
                Ok(n) if n > 0 => {}
                Err(Errno::INTR | Errno::AGAIN) => {}
                _ => {
                    holding = false;
                    let _ = rustix::process::pidfd_send_signal(pidfd, Signal::KILL);
                }
            }
        }
    }
}

/// The init helper: confine, start the command, reap, report how it ended.
fn run_init(invocation: Invocation) -> i32 {
    let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
    // The outside helper died before that took hold: nobody would end us.
    if outside_is_gone() {
        return FAILED;
    }
    // Not dumpable: the command (same user, same Landlock domain) can neither
    // trace this process nor open its descriptors through /proc.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    shield();
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let report = |ending: Ending| {
        let _ = rustix::io::write(std::io::stdin().as_fd(), ending.encode().as_bytes());
        ending.code()
    };
    // Before Landlock, which grants `/proc` as the directory it opens then.
    if invocation.policy.own_proc
        && let Err(problem) = own_proc()
    {
        return fail(&problem);
    }
    if invocation.policy.landlock {
        match confine(&invocation.policy) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return fail(
                    "Landlock is not available on this kernel (Linux 5.13 or newer, with \
                     landlock among the LSMs the kernel enabled at boot)",
                );
            }
            Err(problem) => return fail(&problem),
        }
    }
    if let Err(problem) = drop_capabilities() {
        return fail(&problem);
    }
    if let Err(problem) = filter_syscalls() {
        return fail(&problem);
    }
    let spawned = std::process::Command::new(&invocation.program)
        .arg0(&invocation.argv0)
        .args(&invocation.args)
        .stdin(Stdio::null())
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(err) => {
            eprintln!(
                "hivekernel sandbox: cannot start {}: {err}",
                PathBuf::from(&invocation.program).display()
            );
            let code = if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return report(Ending::Exit(code));
        }
    };
    let command = child.id() as i32;
    let ending = loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get() == command => {
                break Ending::of(status);
            }
            Ok(Some(_)) | Err(Errno::INTR) => {}
            Ok(None) | Err(_) => break Ending::Exit(FAILED),
        }
    };
    // As PID 1 of a namespace, exiting ends everything left in it; without
    // one, whatever was reparented to us is ended by hand.
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        end_descendants();
    }
    report(ending)
}

impl Ending {
    fn code(self) -> i32 {
        match self {
            Ending::Exit(code) => code,
            Ending::Signal(sig) => 128 + sig,
        }
    }
}

/// The report pipe's reading end is closed: the outside helper is gone.
fn outside_is_gone() -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let stdin = std::io::stdin();
    let mut fds = [PollFd::from_borrowed_fd(stdin.as_fd(), PollFlags::empty())];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP)
}

/// Answers what this host supports, as JSON on stdout.
fn probe() -> i32 {
    let containment = contain();
    let own_proc = containment != Containment::Subreaper && {
        hand_on_mount_capability(containment);
        // A child, since only a process in the new PID namespace can mount
        // its procfs (this one stays in the old namespace).
        std::process::Command::new("/proc/self/exe")
            .arg(PROBE_PROC)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    // Asked for on its own and as a hard requirement, so that `Ok` means enforced.
    let signal_scoping = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::Signal)
        .and_then(|ruleset| ruleset.create())
        .and_then(|ruleset| ruleset.restrict_self())
        .is_ok();
    let landlock = confine(&Policy {
        landlock: true,
        ..Policy::default()
    });
    let support = Support {
        landlock: landlock.ok().flatten(),
        containment,
        signal_scoping,
        own_proc,
    };
    match serde_json::to_string(&support) {
        Ok(json) => {
            println!("{json}");
            0
        }
        Err(err) => fail(&format!("cannot encode the probe's answer: {err}")),
    }
}

/// A new PID namespace for the children to come: directly as root, else
/// inside a new user namespace that maps our user and group to themselves.
fn contain() -> Containment {
    use nix::sched::{CloneFlags, unshare};
    if unshare(CloneFlags::CLONE_NEWPID).is_ok() {
        return Containment::PidNamespace;
    }
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    if unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID).is_ok() {
        // Without the maps files still belong to the user, but show as nobody.
        let _ = std::fs::write("/proc/self/setgroups", "deny")
            .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")))
            .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")));
        return Containment::UserNamespace;
    }
    Containment::Subreaper
}

/// In a new user namespace, hands `CAP_SYS_ADMIN` there (held since the
/// `unshare`) on to the next program as an ambient capability, so that the
/// init helper, which runs as the same user and so would start with none,
/// can make its mount namespace and mount its `/proc`; it drops it with
/// every other capability before the command starts. Root needs nothing.
fn hand_on_mount_capability(containment: Containment) {
    use rustix::thread::CapabilitySet;
    if containment != Containment::UserNamespace {
        return;
    }
    // A failure shows where the capability is needed, as that mount's error.
    let _ = rustix::thread::capabilities(None).and_then(|mut sets| {
        sets.inheritable |= CapabilitySet::SYS_ADMIN;
        rustix::thread::set_capabilities(None, sets)?;
        rustix::thread::configure_capability_in_ambient_set(CapabilitySet::SYS_ADMIN, true)
    });
}

/// A mount namespace for this process, with every mount in it private (so
/// no mount made here reaches the host's namespace, nor one made there
/// this one), and a fresh procfs on `/proc` for the PID namespace this
/// process is PID 1 of: it and what it starts see their own processes only.
fn own_proc() -> Result<(), String> {
    use nix::sched::{CloneFlags, unshare};
    use rustix::mount::{MountFlags, MountPropagationFlags};
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        return Err(
            "no PID namespace of its own to mount a /proc for: it would show the host's processes"
                .to_owned(),
        );
    }
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|err| format!("cannot make a mount namespace: {err}"))?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|err| format!("cannot make the mounts private: {err}"))?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("proc", "/proc", "proc", flags, None::<&std::ffi::CStr>)
        .map_err(|err| format!("cannot mount a /proc for the sandbox's PID namespace: {err}"))
}

/// Confines this process (and what it starts) by `policy`; `Ok(None)`:
/// the kernel enforces nothing of it, else how much it enforces.
fn confine(policy: &Policy) -> Result<Option<String>, String> {
    let read = AccessFs::from_read(ABI_WANTED);
    let all = AccessFs::from_all(ABI_WANTED);
    let file = AccessFs::from_file(ABI_WANTED);
    let exclusions = rules::Exclusions::new(&policy.forbidden, &policy.hidden);
    let read_only = rules::carve(&policy.read_only, &exclusions);
    let read_write = rules::carve(&policy.read_write, &exclusions);
    let rule = |grant: rules::Grant, access: landlock::BitFlags<AccessFs>| {
        let access = if grant.is_dir { access } else { access & file };
        Ok::<_, landlock::RulesetError>(PathBeneath::new(grant.fd, access))
    };
    let status = Ruleset::default()
        .handle_access(all)
        .and_then(|ruleset| ruleset.scope(Scope::from_all(ABI_WANTED)))
        .and_then(|ruleset| ruleset.create())
        .and_then(|ruleset| ruleset.add_rules(read_only.into_iter().map(|g| rule(g, read))))
        .and_then(|ruleset| ruleset.add_rules(read_write.into_iter().map(|g| rule(g, all))))
        .and_then(|ruleset| ruleset.restrict_self())
        .map_err(|err| format!("cannot apply Landlock: {err}"))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Some("fully enforced".to_owned()),
        RulesetStatus::PartiallyEnforced => Some("partially enforced".to_owned()),
        RulesetStatus::NotEnforced => None,
    })
}

/// Drops every capability, from the bounding set too, so that nothing this
/// process starts has any (even when the kernel runs as root), and sets
/// `no_new_privs`; `Err` if any is left.
fn drop_capabilities() -> Result<(), String> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    for cap in CapabilitySet::all().iter() {
        // EINVAL: a capability this kernel does not know; EPERM: we had no
        // CAP_SETPCAP, and so nothing to drop (checked below).
        let _ = rustix::thread::remove_capability_from_bounding_set(cap);
    }
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none)
        .and_then(|()| rustix::thread::set_no_new_privs(true))
        .map_err(|err| format!("cannot drop capabilities: {err}"))?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let bounding = status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .map(str::trim);
    // Root regains its bounding set at exec: it must be empty then.
    if rustix::process::geteuid().is_root()
        && bounding.is_none_or(|b| !b.trim_start_matches('0').is_empty())
    {
        return Err(format!(
            "cannot drop the capability bounding set (CapBnd: {})",
            bounding.unwrap_or("unknown")
        ));
    }
    Ok(())
}

/// A seccomp filter for the command: no Unix sockets (Landlock controls
/// connecting to a named one only from ABI 9, and a session bus or a
/// container engine's socket is a way out), no new user namespaces (a way to
/// regain capabilities), no io_uring (which opens sockets without the
/// `socket` call); `clone3` answers ENOSYS, since its flags cannot be
/// inspected, so the C library falls back to `clone`, whose flags can.
fn filter_syscalls() -> Result<(), String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let Ok(arch) = TargetArch::try_from(std::env::consts::ARCH) else {
        // No filter for an architecture seccompiler does not know.
        return Ok(());
    };
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value)
            .and_then(|condition| SeccompRule::new(vec![condition]))
    };
    let new_user = libc::CLONE_NEWUSER as u64;
    let refused = || -> Result<_, seccompiler::BackendError> {
        Ok(vec![
            (
                libc::SYS_socket,
                vec![arg(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?],
            ),
            (
                libc::SYS_unshare,
                vec![arg(0, SeccompCmpOp::MaskedEq(new_user), new_user)?],
            ),
            (
                libc::SYS_clone,
                vec![arg(0, SeccompCmpOp::MaskedEq(new_user), new_user)?],
            ),
        ])
    };
    let unknown = [
        libc::SYS_clone3,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    let filters = refused().and_then(|refused| {
        let eperm = SeccompFilter::new(
            refused.into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )?;
        let enosys = SeccompFilter::new(
            unknown.into_iter().map(|call| (call, Vec::new())).collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )?;
        Ok((eperm, enosys))
    });
    let (eperm, enosys) =
        filters.map_err(|err| format!("cannot build the seccomp filter: {err}"))?;
    for filter in [eperm, enosys] {
        let program = seccompiler::BpfProgram::try_from(filter)
            .map_err(|err| format!("cannot compile the seccomp filter: {err}"))?;
        seccompiler::apply_filter(&program)
            .map_err(|err| format!("cannot apply the seccomp filter: {err}"))?;
    }
    Ok(())
}

/// SIGTERM, SIGINT and SIGHUP no longer end this process (a process group
/// stop is for the command); the command starts with their defaults.
fn shield() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    for sig in [SIGTERM, SIGINT, SIGHUP] {
        let _ = signal_hook::flag::register(sig, Arc::new(AtomicBool::new(false)));
    }
}

/// Kills and reaps every child, including orphans reparented to us (we are
/// a subreaper) as their parents die, until none is left.
fn end_descendants() {
    loop {
        for pid in children() {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some(_)) | Err(Errno::INTR) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

/// This process's children, from `/proc` (the parent field of each `stat`).
fn children() -> Vec<Pid> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold anything but ends at the last ')'.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid: i32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == me).then(|| Pid::from_raw(pid)).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_travel_between_the_helpers() {
        for ending in [Ending::Exit(0), Ending::Exit(3), Ending::Signal(9)] {
            assert_eq!(Ending::decode(&ending.encode()), Some(ending));
        }
        assert_eq!(Ending::decode(""), None);
        assert_eq!(Ending::decode("exit x"), None);
        assert_eq!(Ending::Signal(15).code(), 143);
    }
}
