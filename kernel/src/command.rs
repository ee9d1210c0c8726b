//! The `exec` runtime's name, and the checks on an `exec` command before
//! anything is started: argv and env
//! shapes and sizes, and that the program can be found and run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hivekernel_agents::ExecCommand;

/// The name the `exec` runtime is registered under.
pub const EXEC_RUNTIME: &str = "exec";

/// Most arguments in a command, program included.
pub const MAX_ARGS: usize = 1024;
/// Most environment variables a command may add.
pub const MAX_ENV: usize = 1024;
/// Most bytes over all arguments, and over all variables.
pub const MAX_COMMAND_BYTES: usize = 128 * 1024;
/// Longest working directory, in bytes (Linux's `PATH_MAX`).
pub const MAX_CWD_BYTES: usize = 4096;

/// The PEM file an `exec` process trusts for a server that serves TLS.
pub const TLS_CA_ENV: &str = "HIVEKERNEL_TLS_CA";

/// systemd's notification socket (`Type=notify`): the kernel's own, so
/// never handed on to the processes it starts.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Variables the kernel sets (or clears) for every `exec` process; a command may not set them.
pub const RESERVED_ENV: [&str; 4] = [
    "HIVEKERNEL_ADDR",
    "HIVEKERNEL_PID",
    "HIVEKERNEL_TOKEN",
    TLS_CA_ENV,
];

/// Why `command` cannot be run, naming the field (`command[2]`, `env.FOO`).
/// On success, the program to execute: an absolute path.
pub fn check(command: &ExecCommand) -> Result<PathBuf, String> {
    let Some(program) = command.argv.first() else {
        return Err("command must not be empty: give the program and its arguments".into());
    };
    if command.argv.len() > MAX_ARGS {
        return Err(format!(
            "command has {} arguments (at most {MAX_ARGS})",
            command.argv.len()
        ));
    }
    if let Some(i) = command.argv.iter().position(|arg| arg.contains('\0')) {
        return Err(format!("command[{i}] contains a NUL byte"));
    }
    let bytes: usize = command.argv.iter().map(String::len).sum();
    if bytes > MAX_COMMAND_BYTES {
        return Err(format!(
            "command is {bytes} bytes long (at most {MAX_COMMAND_BYTES})"
        ));
    }
    check_env(command)?;
    check_cwd(command)?;
    resolve_program(program, command.env.get("PATH").map(String::as_str))
}

/// A working directory, when given: absolute, without NUL bytes, of a sane length.
fn check_cwd(command: &ExecCommand) -> Result<(), String> {
    let Some(cwd) = &command.cwd else {
        return Ok(());
    };
    let text = cwd.as_os_str().as_encoded_bytes();
    if text.len() > MAX_CWD_BYTES {
        return Err(format!(
            "cwd is {} bytes long (at most {MAX_CWD_BYTES})",
            text.len()
        ));
    }
    if text.contains(&0) {
        return Err("cwd contains a NUL byte".into());
    }
    if !cwd.is_absolute() {
        return Err(format!(
            "cwd must be an absolute path, got {:?}",
            cwd.display().to_string()
        ));
    }
    Ok(())
}

fn check_env(command: &ExecCommand) -> Result<(), String> {
    if command.env.len() > MAX_ENV {
        return Err(format!(
            "env has {} variables (at most {MAX_ENV})",
            command.env.len()
        ));
    }
    let mut bytes = 0;
    for (key, value) in &command.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(format!(
                "env: {key:?} is not a variable name (not empty, no '=' and no NUL)"
            ));
        }
        if value.contains('\0') {
            return Err(format!("env.{key} contains a NUL byte"));
        }
        if RESERVED_ENV.contains(&key.as_str()) {
            return Err(format!(
                "env.{key} is set by the kernel and may not be given"
            ));
        }
        bytes += key.len() + value.len();
    }
    if bytes > MAX_COMMAND_BYTES {
        return Err(format!(
            "env is {bytes} bytes long (at most {MAX_COMMAND_BYTES})"
        ));
    }
    Ok(())
}

/// An absolute path is used as it is; a bare name is looked up in `path`
/// (the command's own PATH) or the kernel's PATH. A relative path with a
/// slash is refused: relative to what would be a guess.
fn resolve_program(program: &str, path: Option<&str>) -> Result<PathBuf, String> {
    if program.is_empty() {
        return Err("command[0] (the program) must not be empty".into());
    }
    let given = Path::new(program);
    if given.is_absolute() {
        return match executable(given) {
            Ok(()) => Ok(given.to_owned()),
            Err(why) => Err(format!("command[0] {program:?}: {why}")),
        };
    }
    if program.contains('/') {
        return Err(format!(
            "command[0] {program:?} is a relative path: give an absolute path, or a program name \
             to look up in PATH"
        ));
    }
    let search = path
        .map(str::to_owned)
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    std::env::split_paths(&search)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate).is_ok())
        .ok_or_else(|| format!("command[0] {program:?}: not found in PATH"))
}

/// Whether `path` is a regular file someone may execute.
fn executable(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err("not a regular file".into()),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Err("not executable".into()),
        Ok(_) => Ok(()),
        Err(err) => Err(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn command(argv: &[&str]) -> ExecCommand {
        ExecCommand {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            ..ExecCommand::default()
        }
    }

    #[test]
    fn a_working_directory_must_be_absolute() {
        let with = |cwd: &str| ExecCommand {
            cwd: Some(cwd.into()),
            ..command(&["sh"])
        };
        assert!(check(&with("/tmp")).is_ok());
        let relative = check(&with("work/here")).unwrap_err();
        assert!(
            relative.contains("cwd must be an absolute path"),
            "{relative}"
        );
        let nul = check(&with("/tmp/a\0b")).unwrap_err();
        assert!(nul.contains("NUL"), "{nul}");
        let long = check(&with(&format!("/{}", "a".repeat(MAX_CWD_BYTES)))).unwrap_err();
        assert!(long.contains("at most 4096"), "{long}");
    }

    #[test]
    fn programs_are_found_in_path_or_by_absolute_path() {
        let sh = check(&command(&["sh", "-c", "true"])).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        assert_eq!(check(&command(&["/bin/sh"])).unwrap(), Path::new("/bin/sh"));
    }

    #[test]
    fn bad_commands_are_refused_naming_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.txt");
        std::fs::write(&plain, "not a program").unwrap();
        let plain = plain.to_str().unwrap();
        let cases: [(ExecCommand, &str); 7] = [
            (command(&[]), "must not be empty"),
            (command(&[""]), "must not be empty"),
            (command(&["sh", "a\0b"]), "command[1] contains a NUL"),
            (command(&["./agent.py"]), "relative path"),
            (command(&["/nonexistent/agent"]), "No such file"),
            (command(&["no-such-program-anywhere"]), "not found in PATH"),
            (command(&[plain]), "not executable"),
        ];
        for (cmd, needle) in cases {
            let err = check(&cmd).unwrap_err();
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
        }
        let mut reserved = command(&["sh"]);
        reserved.env.insert("HIVEKERNEL_TOKEN".into(), "x".into());
        assert!(check(&reserved).unwrap_err().contains("set by the kernel"));
        let mut bad_key = command(&["sh"]);
        bad_key.env.insert("A=B".into(), "x".into());
        assert!(check(&bad_key).unwrap_err().contains("not a variable name"));
        let long = command(&["sh", &"x".repeat(MAX_COMMAND_BYTES)]);
        assert!(check(&long).unwrap_err().contains("bytes long"));
    }
}
