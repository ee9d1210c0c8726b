//! Malformed startup configs: every mistake is reported at its location, and
//! `hivekernel start` with one of them starts nothing (its data directory is
//! never created).

use std::path::Path;

use hivekernel_kernel::RuntimeRegistry;
use hivekernel_kernel::config::{Config, ConfigIssue};
use hivekernel_kernel::daemon::{self, StartError, StartOptions};

/// (config text, where the issue is, a fragment of its message).
fn cases() -> Vec<(String, &'static str, &'static str)> {
    let huge_name = "n".repeat(1 << 20);
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    vec![
        (String::new(), "", "invalid JSON"),
        ("\u{feff}{}".into(), "", "invalid JSON"),
        ("{".into(), "", "invalid JSON"),
        ("null".into(), "", "must be a JSON object"),
        ("\"kernel\"".into(), "", "must be a JSON object"),
        (deep, "", "recursion limit"),
        // Two equal keys: which one counts would be a guess.
        (
            r#"{"kernel": {"listen": "127.0.0.1:0", "listen": "0.0.0.0:50051"}}"#.into(),
            "",
            "duplicate key \"listen\" in kernel at line 1",
        ),
        (
            r#"{"agents": [{"name": "a", "role": "task", "role": "daemon"}]}"#.into(),
            "",
            "duplicate key \"role\" in agents[0]",
        ),
        // Files of the kernel's interfaces look regular and hold secrets.
        (
            r#"{"agents": [{"name": "a", "system_prompt_file": "/proc/self/environ"}]}"#.into(),
            "agents[0] (a).system_prompt_file",
            "it is in /proc, an interface of the operating system",
        ),
        (
            r#"{"agents": [{"name": "a", "system_prompt_file": "/sys/kernel/mm/transparent_hugepage/enabled"}]}"#.into(),
            "agents[0] (a).system_prompt_file",
            "it is in /sys, an interface of the operating system",
        ),
        (
            r#"{"kernel": 5}"#.into(),
            "kernel",
            "expected a JSON object",
        ),
        (
            r#"{"kernel": {"max_depth": "8"}}"#.into(),
            "kernel.max_depth",
            "invalid type: string \"8\"",
        ),
        (
            r#"{"kernel": {"max_depth": 1e300}}"#.into(),
            "kernel.max_depth",
            "invalid type: floating point",
        ),
        (
            r#"{"kernel": {"mailbox_capacity": 18446744073709551616}}"#.into(),
            "kernel.mailbox_capacity",
            "invalid type",
        ),
        (
            r#"{"kernel": {"max_children": -1}}"#.into(),
            "kernel.max_children",
            "invalid value: integer `-1`",
        ),
        (
            r#"{"kernel": {"max_depth": 4294967296}}"#.into(),
            "kernel.max_depth",
            "invalid value: integer `4294967296`",
        ),
        (
            r#"{"kernel": {"mailbox_capacity": 0}}"#.into(),
            "kernel.mailbox_capacity",
            "got 0",
        ),
        (
            r#"{"kernel": {"listen": "127.0.0.1:99999"}}"#.into(),
            "kernel.listen",
            "99999",
        ),
        (
            r#"{"kernel": {"metrics": {"listen": "localhost"}}}"#.into(),
            "kernel.metrics.listen",
            "invalid socket address \"localhost\"",
        ),
        (
            r#"{"kernel": {"metrics": {}}}"#.into(),
            "kernel.metrics.listen",
            "is required",
        ),
        (
            r#"{"kernel": {"metrics": {"port": 9464}}}"#.into(),
            "kernel.metrics.port",
            "unknown field `port`",
        ),
        (
            r#"{"kernel": {"dashboard": {"listen": "localhost:50052"}}}"#.into(),
            "kernel.dashboard.listen",
            "invalid socket address \"localhost:50052\"",
        ),
        (
            r#"{"kernel": {"dashboard": {"enabled": "yes"}}}"#.into(),
            "kernel.dashboard.enabled",
            "invalid type",
        ),
        (
            r#"{"kernel": {"dashboard": {"enabled": false, "listen": "127.0.0.1:8080"}}}"#.into(),
            "kernel.dashboard.listen",
            "enabled is false",
        ),
        (
            r#"{"kernel": {"dashboard": true}}"#.into(),
            "kernel.dashboard",
            "expected a JSON object",
        ),
        (
            r#"{"kernel": {"log": {"level": "loud"}}}"#.into(),
            "kernel.log.level",
            "unknown log level \"loud\"",
        ),
        (
            r#"{"kernel": {"log": {"level": "info,hivekernel=loud"}}}"#.into(),
            "kernel.log.level",
            "invalid log filter \"info,hivekernel=loud\"",
        ),
        (
            r#"{"kernel": {"log": {"format": "xml"}}}"#.into(),
            "kernel.log.format",
            "unknown log format \"xml\" (expected text or json)",
        ),
        (
            r#"{"kernel": {"rm_rf": true}}"#.into(),
            "kernel.rm_rf",
            "unknown field `rm_rf`",
        ),
        (r#"{"agents": {"name": "a"}}"#.into(), "agents", "sequence"),
        (
            r#"{"agents": [7]}"#.into(),
            "agents[0]",
            "must be a JSON object",
        ),
        (r#"{"agents": [{}]}"#.into(), "agents[0].name", "missing"),
        (
            r#"{"agents": [{"name": ""}]}"#.into(),
            "agents[0].name",
            "empty",
        ),
        (
            r#"{"agents": [{"name": "a\u0000b"}]}"#.into(),
            "agents[0].name",
            "control",
        ),
        (
            format!(r#"{{"agents": [{{"name": "{huge_name}"}}]}}"#),
            "agents[0].name",
            "at most 128",
        ),
        (
            r#"{"agents": [{"name": "a"}, {"name": "a"}]}"#.into(),
            "agents[1] (a).name",
            "duplicate",
        ),
        (
            r#"{"agents": [{"name": "a", "role": "root"}]}"#.into(),
            "agents[0] (a).role",
            "root",
        ),
        (
            r#"{"agents": [{"name": "a", "role": "kernel"}]}"#.into(),
            "agents[0] (a).role",
            "kernel",
        ),
        (
            r#"{"agents": [{"name": "a", "tools": ["read_file", "read_file"]}]}"#.into(),
            "agents[0] (a).tools[1]",
            "read_file",
        ),
        (
            r#"{"agents": [{"name": "a", "tools": ["rm_rf"]}]}"#.into(),
            "agents[0] (a).tools[0]",
            "rm_rf",
        ),
        (
            r#"{"agents": [{"name": "a", "limits": {"max_depth": 1000}}]}"#.into(),
            "agents[0] (a).limits.max_depth",
            "1000",
        ),
        (
            r#"{"agents": [{"name": "a", "system_prompt_file": "no/such/prompt.md"}]}"#.into(),
            "agents[0] (a).system_prompt_file",
            "prompt.md",
        ),
        (
            r#"{"agents": [{"name": "a", "cron": [{"name": "c", "expression": "61 * * * *"}]}]}"#
                .into(),
            "agents[0] (a).cron[0].expression",
            "cannot parse",
        ),
        (
            r#"{"agents": [{"name": "a", "cron": [{"name": "c", "expression": "* * *"}]}]}"#.into(),
            "agents[0] (a).cron[0].expression",
            "got 3",
        ),
        (
            r#"{"agents": [{"name": "a", "cron": [{"name": "", "expression": "@daily"}]}]}"#.into(),
            "agents[0] (a).cron[0].name",
            "non-empty",
        ),
        (
            r#"{"agents": [{"name": "a", "cron": [{"name": "c", "expression": "@daily"},
                                                 {"name": "c", "expression": "@hourly"}]}]}"#
                .into(),
            "agents[0] (a).cron[1].name",
            "duplicate cron name",
        ),
        (
            r#"{"agents": [{"name": "a", "cron": "@daily"}]}"#.into(),
            "agents[0] (a).cron",
            "array",
        ),
        (
            r#"{"tool_agent": {"web": {"allow_addresses": ["intranet"]}}}"#.into(),
            "tool_agent.web.allow_addresses[0]",
            "invalid IP address",
        ),
        (
            r#"{"roles": {"task": {"restart": {"policy": "forever"}}}}"#.into(),
            "roles.task.restart.policy",
            "forever",
        ),
    ]
}

/// `hivekernel start CONFIG --data-dir DATA_DIR --listen 127.0.0.1:0`.
fn start_options(config: &Path, data_dir: &Path) -> StartOptions {
    StartOptions {
        config: config.to_owned(),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(data_dir.to_owned()),
        insecure_remote: false,
        tls: Default::default(),
        metrics_listen: None,
        model: None,
        dashboard: None,
        cluster: None,
        node: None,
        insecure_cluster: false,
        cluster_secret: None,
    }
}

fn load(text: &str, path: &Path) -> Result<Config, Vec<ConfigIssue>> {
    Config::from_str_at(text, path, &RuntimeRegistry::builtin().known()).map_err(|e| e.issues)
}

#[test]
fn every_malformed_config_is_refused_at_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("startup.json");
    for (text, location, says) in cases() {
        let shown = &text[..text.len().min(80)];
        let issues = match load(&text, &path) {
            Ok(_) => panic!("accepted: {shown}"),
            Err(issues) => issues,
        };
        assert!(
            issues
                .iter()
                .any(|i| i.location == location && i.message.contains(says)),
            "{shown}: no issue at {location:?} saying {says:?} in {issues:#?}"
        );
        for issue in &issues {
            assert!(!issue.message.is_empty(), "{shown}: {issues:#?}");
            // A message never echoes a huge value back whole.
            assert!(
                issue.message.len() < 4096,
                "{shown}: {}",
                issue.message.len()
            );
        }
    }
}

#[test]
fn bytes_that_are_not_utf8_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("startup.json");
    std::fs::write(&path, b"{\"kernel\": {\"data_dir\": \"\xff\xfe\"}}").unwrap();
    let err = Config::load(&path, &RuntimeRegistry::builtin().known()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("UTF-8"),
        "{text}"
    );
}

#[tokio::test]
async fn start_with_a_malformed_config_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("startup.json");
    let data_dir = dir.path().join("data");
    for (text, location, _) in cases() {
        std::fs::write(&path, &text).unwrap();
        let err = daemon::run(start_options(&path, &data_dir))
            .await
            .unwrap_err();
        assert!(matches!(err, StartError::Config(_)), "{location}: {err}");
        assert_eq!(err.exit_code(), 2);
        let shown = err.to_string();
        assert!(
            shown.starts_with(&path.display().to_string()) && shown.contains(location),
            "{location}: {shown}"
        );
        assert!(
            !data_dir.exists(),
            "{location}: the data directory was created"
        );
    }
    // The directory holds the config file and nothing else.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["startup.json"]);
}

/// Runs `f` on its own thread, failing if it has not returned within 10 s:
/// a read that blocks (a FIFO) or never ends (`/dev/zero`) then fails the
/// test instead of hanging it.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not return within 10 s"))
}

/// A FIFO at `path` that nobody writes to.
fn fifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn a_file_the_config_names_is_read_only_when_it_is_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("prompt.fifo");
    fifo(&pipe);
    let config = dir.path().join("startup.json");
    let targets = [
        (Path::new("/dev/zero"), "a character device"),
        (pipe.as_path(), "a FIFO"),
        (dir.path(), "a directory"),
    ];
    for (target, kind) in targets {
        let text = serde_json::json!({
            "agents": [{"name": "a", "system_prompt_file": target}]
        });
        std::fs::write(&config, text.to_string()).unwrap();
        let path = config.clone();
        let err = within("loading the config", move || {
            Config::load(&path, &RuntimeRegistry::builtin().known())
        })
        .unwrap_err();
        assert!(
            err.issues.iter().any(|i| {
                i.location == "agents[0] (a).system_prompt_file"
                    && i.message.contains(kind)
                    && i.message.contains("not a regular file")
            }),
            "{}: {err}",
            target.display()
        );
    }
    // The config file itself, too.
    let err = within("loading a FIFO as the config", move || {
        Config::load(&pipe, &RuntimeRegistry::builtin().known())
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("a FIFO, not a regular file"),
        "{err}"
    );
}

#[tokio::test]
async fn start_with_a_fifo_for_a_prompt_or_a_tls_file_exits_2_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("named.fifo");
    fifo(&pipe);
    let config = dir.path().join("startup.json");
    let data_dir = dir.path().join("data");
    let configs = [
        serde_json::json!({"agents": [{"name": "a", "system_prompt_file": pipe}]}),
        serde_json::json!({"kernel": {"tls": {"cert": pipe, "key": pipe}}}),
        serde_json::json!({"kernel": {"tls": {"cert": "/dev/zero", "key": "/dev/zero"}}}),
    ];
    for text in configs {
        std::fs::write(&config, text.to_string()).unwrap();
        let options = start_options(&config, &data_dir);
        let started =
            tokio::time::timeout(std::time::Duration::from_secs(10), daemon::run(options)).await;
        let err = started
            .unwrap_or_else(|_| panic!("start blocked on {text}"))
            .unwrap_err();
        assert_eq!(err.exit_code(), 2, "{text}: {err}");
        assert!(
            err.to_string().contains("not a regular file"),
            "{text}: {err}"
        );
        assert!(!data_dir.exists(), "{text}: the data directory was created");
    }
}

#[tokio::test]
async fn a_data_dir_that_is_a_file_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("startup.json");
    std::fs::write(&config, "{}").unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let err = daemon::run(start_options(&config, &file))
        .await
        .unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&file.display().to_string()) && text.contains("is not a directory"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "x",
        "the file was touched"
    );
}

#[tokio::test]
async fn a_skill_file_that_links_out_of_its_directory_is_skipped_unread() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let secret = base.join("secret.md");
    std::fs::write(
        &secret,
        "---\nname: linked\ndescription: the secret's first line\n---\nsecret\n",
    )
    .unwrap();
    let skills = base.join("skills");
    std::fs::create_dir_all(skills.join("linked")).unwrap();
    std::os::unix::fs::symlink(&secret, skills.join("linked/SKILL.md")).unwrap();
    let mut settings = hivekernel_tests::test_settings();
    settings.skills = vec![skills];
    let (kernel, _) = hivekernel_tests::kernel_with(settings).await;
    let (listed, problems) = kernel
        .skills()
        .listing(hivekernel_kernel::Caller::Admin)
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    let problem = problems
        .iter()
        .find(|p| p.path.ends_with("linked/SKILL.md"))
        .unwrap_or_else(|| panic!("no problem: {problems:?}"));
    assert!(problem.skipped);
    assert!(
        problem.message.contains("symbolic link") && !problem.message.contains("secret"),
        "{problem:?}"
    );
    kernel.shutdown().await;
}
