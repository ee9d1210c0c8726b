//! Every `hivekernel` example in README.md, run as written and in order,
//! from a fresh directory, against `hivekernel start configs/startup.json`.
//!
//! The examples that need what a test machine lacks are skipped by rule,
//! and the rule is checked too, so a new example is run unless it is one of
//! these: the set-up commands (cargo, pip, the alias), other kernels
//! (`start`, with TLS files, a model server or the Python agent's config),
//! and grpcurl.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a command that follows (`--follow`) runs before it counts as working.
const FOLLOW_FOR: Duration = Duration::from_secs(2);

/// The shell commands of README.md's `sh` blocks, continuation lines joined,
/// comments dropped.
fn examples(readme: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            in_block = line == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let line = strip_comment(line);
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head.trim());
                pending.push(' ');
            }
            None => {
                pending.push_str(line.trim());
                if !pending.is_empty() {
                    commands.push(std::mem::take(&mut pending));
                }
            }
        }
    }
    commands
}

/// The line up to a `#` that starts a comment (after a blank, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

/// Splits a command into words as sh does for these examples: blanks
/// separate, single and double quotes group.
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote = None;
    for c in command.chars() {
        match (quote, c) {
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), _) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (_, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// `name=$(command)`: the variable and the command whose output it takes.
fn captured(line: &str) -> Option<(&str, &str)> {
    let (name, rest) = line.split_once("=$(")?;
    let command = rest.strip_suffix(')')?;
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    (valid && command.starts_with("hivekernel ")).then_some((name, command))
}

/// `NAME=value` before a command: a variable set for that command alone.
fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    valid.then_some((name, value))
}

/// The command after the variables set for it.
fn without_assignments(line: &str) -> &str {
    let mut rest = line;
    while let Some((word, after)) = rest.split_once(' ')
        && assignment(word).is_some()
    {
        rest = after.trim_start();
    }
    rest
}

/// Why an example is not run here, if it is not.
fn skipped(command: &str) -> Option<&'static str> {
    let first = command.split_whitespace().next().unwrap_or_default();
    let set_up = [
        "cargo",
        "python3",
        "npm",
        "sudo",
        "alias",
        "ollama",
        "llama-server",
        "vllm",
        "nats-server",
    ];
    if set_up.contains(&first) || first.starts_with("target/") || first.starts_with("tests/") {
        return Some("set-up");
    }
    if first == "grpcurl" || first.starts_with("TOKEN=") {
        return Some("grpcurl");
    }
    if command.contains(" start ") {
        return Some("another kernel");
    }
    if command.contains("--tls-") {
        return Some("TLS files");
    }
    None
}

#[test]
fn every_readme_example_runs_as_written_in_order() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let commands = examples(&readme);
    let (run, skip): (Vec<&String>, Vec<&String>) =
        commands.iter().partition(|c| skipped(c).is_none());
    // Skipped by rule; nothing else is.
    for command in &skip {
        let why = skipped(command).unwrap();
        assert!(
            ["set-up", "grpcurl", "another kernel", "TLS files"].contains(&why),
            "{command}"
        );
    }
    assert!(
        run.len() >= 25,
        "only {} examples found: {run:#?}",
        run.len()
    );
    assert!(
        run.iter()
            .all(|c| without_assignments(c).starts_with("hivekernel ") || captured(c).is_some()),
        "{run:#?}"
    );

    // A fresh directory holding what the README's commands name.
    let dir = tempfile::tempdir().unwrap();
    for name in ["configs", "prompts", "README.md", "sdk-examples"] {
        std::os::unix::fs::symlink(
            repo.join(name).canonicalize().unwrap(),
            dir.path().join(name),
        )
        .unwrap();
    }
    let data = dir.path().join(".hivekernel");
    let log = std::fs::File::create(dir.path().join("kernel.log")).unwrap();
    let mut kernel = Command::new(crate::support::binary())
        .args(["start", "configs/startup.json", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data)
        .current_dir(dir.path())
        .env_remove("HIVEKERNEL_DATA_DIR")
        .env_remove("HIVEKERNEL_LLM_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !data.join("kernel.addr").exists() {
        assert!(Instant::now() < deadline, "the kernel did not start");
        assert!(kernel.try_wait().unwrap().is_none(), "the kernel exited");
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut failures = Vec::new();
    let mut vars: Vec<(String, String)> = Vec::new();
    for line in run {
        let (var, command) = match captured(line) {
            Some((var, command)) => (Some(var), command),
            None => (None, line.as_str()),
        };
        let expand = |word: &str| match word.strip_prefix('$') {
            Some(name) => vars
                .iter()
                .find(|(var, _)| var == name)
                .map_or(word.to_owned(), |(_, value)| value.clone()),
            None => word.to_owned(),
        };
        let mut args: Vec<String> = words(command).iter().map(|word| expand(word)).collect();
        let env: Vec<(String, String)> = args
            .iter()
            .map_while(|word| assignment(word))
            .map(|(name, value)| (name.to_owned(), expand(value)))
            .collect();
        args.drain(..env.len());
        let mut child = Command::new(crate::support::binary())
            .args(&args[1..])
            .current_dir(dir.path())
            .env_remove("HIVEKERNEL_ADDR")
            .env_remove("HIVEKERNEL_TOKEN")
            .env_remove("HIVEKERNEL_TOKEN_FILE")
            .env_remove("HIVEKERNEL_DATA_DIR")
            .envs(env)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if args.iter().any(|a| a == "--follow" || a == "-f") {
            std::thread::sleep(FOLLOW_FOR);
            match child.try_wait().unwrap() {
                None => {
                    child.kill().unwrap();
                    child.wait().unwrap();
                }
                Some(status) => failures.push(format!("{command}: ended with {status}")),
            }
            continue;
        }
        let output = child.wait_with_output().unwrap();
        if let Some(var) = var {
            let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            vars.push((var.to_owned(), value));
        }
        if !output.status.success() {
            failures.push(format!(
                "{command}: {}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    let _ = kernel.kill();
    let _ = kernel.wait();
    assert!(
        failures.is_empty(),
        "README examples failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn examples_are_read_like_sh_reads_them() {
    let readme = "text\n```sh\nhivekernel a \"b c\" 'd # e'   # comment\nhivekernel x \\\n  --y z\n```\n```\nnot sh\n```\n";
    let commands = examples(readme);
    assert_eq!(
        commands,
        ["hivekernel a \"b c\" 'd # e'", "hivekernel x --y z"]
    );
    assert_eq!(words(&commands[0]), ["hivekernel", "a", "b c", "d # e"]);
    assert_eq!(words("a '' b"), ["a", "", "b"]);
    assert_eq!(
        without_assignments("HIVEKERNEL_TOKEN=$ro A=1 hivekernel ps"),
        "hivekernel ps"
    );
    assert_eq!(
        without_assignments("ro=$(hivekernel x)"),
        "ro=$(hivekernel x)"
    );
}
