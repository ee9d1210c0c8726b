//! External agents (runtime `exec`) end to end: a real kernel served over
//! gRPC, real OS processes, the Python client and the Python echo agent
//! from sdk-examples, and small shell agents driven from Rust.
//!
//! The Python tests need an interpreter with grpcio: `$HIVEKERNEL_PYTHON`
//! (CI sets it), else `python3`. Without grpcio they fail, saying how to fix
//! it; `HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1` skips them instead.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hivekernel_agents::Pid;
use hivekernel_kernel::Caller;
use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::delivery::Item;
use hivekernel_tests::exec::{
    Client, ExecKernel, client_py, find_after, group_members, os_alive, python,
};
use hivekernel_tests::wait_until;
use tonic::{Code, Status, Streaming};

const STEP: Duration = Duration::from_secs(20);

fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, needle: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{needle:?} not in {:?}",
        status.message()
    );
}

/// Spawns an exec process under PID 1 as the admin.
async fn spawn_exec(client: &mut Client, name: &str, command: &[&str]) -> u64 {
    client
        .spawn(pb::SpawnRequest {
            parent: 1,
            name: name.into(),
            runtime: "exec".into(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .pid
}

/// The log file the kernel reports for `pid`.
async fn log_of(client: &mut Client, pid: u64) -> PathBuf {
    let info = client
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.runtime, "exec");
    assert!(!info.log_path.is_empty(), "{info:?}");
    PathBuf::from(info.log_path)
}

/// Waits until the log at `path` holds `text`.
async fn wait_for_log(path: &Path, text: &str) {
    let what = format!("{text:?} in {}", path.display());
    wait_until(&what, STEP, || async {
        std::fs::read_to_string(path).is_ok_and(|log| log.contains(text))
    })
    .await;
}

/// A shell agent that logs its OS pid and token, then sleeps without attaching.
const SLEEPER: &str = r#"echo "os_pid=$$ token=$HIVEKERNEL_TOKEN addr=$HIVEKERNEL_ADDR pid=$HIVEKERNEL_PID" >&2; exec sleep 600"#;

/// Spawns [`SLEEPER`] and returns its PID, log, OS pid and token.
async fn sleeper(served: &ExecKernel, name: &str) -> (u64, PathBuf, u32, String) {
    let mut admin = served.admin();
    let pid = spawn_exec(&mut admin, name, &["sh", "-c", SLEEPER]).await;
    let log = log_of(&mut admin, pid).await;
    wait_for_log(&log, "os_pid=").await;
    let os_pid = find_after(&log, "os_pid").unwrap().parse().unwrap();
    let token = find_after(&log, "token").unwrap();
    (pid, log, os_pid, token)
}

/// The next item of an attach stream, within [`STEP`].
/// Spawns `echo_agent.py` named `name` through the Python client and waits
/// until it has attached; its PID and the OS pid it logged.
async fn python_agent(python: &Path, served: &ExecKernel, name: &str) -> (u64, u32) {
    let pid: u64 = client_py(python, served, &["spawn", "--name", name])
        .await
        .ok()
        .parse()
        .unwrap();
    let log = log_of(&mut served.admin(), pid).await;
    wait_for_log(&log, &format!("attached as {name}")).await;
    let os_pid = find_after(&log, "os pid").unwrap().parse().unwrap();
    (pid, os_pid)
}

async fn next(stream: &mut Streaming<pb::Delivery>) -> Item {
    tokio::time::timeout(STEP, stream.message())
        .await
        .expect("a delivery in time")
        .unwrap()
        .expect("the stream is still open")
        .item
        .expect("a delivery has an item")
}

async fn attach(client: &mut Client) -> Streaming<pb::Delivery> {
    attach_with(client, false).await
}

/// An attach stream; with `auto_ack`, messages need no acknowledgement.
async fn attach_with(client: &mut Client, auto_ack: bool) -> Streaming<pb::Delivery> {
    let mut stream = client
        .attach(pb::AttachRequest { pid: 0, auto_ack })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(next(&mut stream).await, Item::Attached(_)));
    stream
}

/// Waits up to 20 s for `pid` to exit and collects its exit record.
async fn collect(admin: &mut Client, pid: u64) -> pb::ExitRecord {
    admin
        .wait_child(pb::WaitChildRequest {
            pid,
            timeout_ms: 20_000,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Acknowledges messages; how many were waiting for it.
async fn ack(client: &mut Client, ids: &[u64]) -> u32 {
    client
        .ack_messages(pb::AckMessagesRequest {
            message_ids: ids.to_vec(),
        })
        .await
        .unwrap()
        .into_inner()
        .acknowledged
}

async fn complete(client: &mut Client, request_id: u64, output: &str) -> Result<(), Status> {
    client
        .complete_task(pb::CompleteTaskRequest {
            request_id,
            success: true,
            output: output.into(),
            error: String::new(),
        })
        .await
        .map(drop)
}

#[tokio::test]
async fn python_client_spawns_an_agent_that_answers_tasks() {
    let Some(python) = python() else { return };
    let served = ExecKernel::start().await;
    let spawned = client_py(&python, &served, &["spawn", "--name", "py-echo"]).await;
    let pid: u64 = spawned.ok().parse().unwrap();

    let mut admin = served.admin();
    let log = log_of(&mut admin, pid).await;
    assert!(log.starts_with(served.data_dir().join("logs")), "{log:?}");
    assert_eq!(
        log.file_name().unwrap(),
        format!("{pid}-py-echo.log").as_str()
    );
    wait_for_log(&log, "attached as py-echo").await;

    let tree = client_py(&python, &served, &["tree"]).await;
    let line = format!("py-echo ({pid}) exec");
    assert!(tree.ok().contains(&line), "{line:?} not in {tree:#?}");
    assert!(tree.ok().contains(log.to_str().unwrap()), "{tree:#?}");

    let pid_text = pid.to_string();
    let echoed = client_py(&python, &served, &["exec", &pid_text, "hello there"]).await;
    assert_eq!(echoed.ok(), "echo: hello there");
    // The agent reads its own record with its token: an RPC acting as itself.
    let whoami = client_py(&python, &served, &["exec", &pid_text, "whoami"]).await;
    assert_eq!(whoami.ok(), format!("py-echo (pid {pid})"));

    // Its messages and stderr go to its log.
    client_py(&python, &served, &["send", &pid_text, "note for the log"]).await;
    wait_for_log(&log, "note for the log").await;
    served.stop().await;
}

#[tokio::test]
async fn python_agent_token_cannot_act_as_pid_1() {
    let Some(python) = python() else { return };
    let served = ExecKernel::start().await;
    let pid: u64 = client_py(&python, &served, &["spawn", "--name", "py"])
        .await
        .ok()
        .parse()
        .unwrap();
    let report = client_py(
        &python,
        &served,
        &["exec", &pid.to_string(), "check-permissions"],
    )
    .await;
    let codes: serde_json::Value = serde_json::from_str(report.ok()).unwrap();
    let codes = codes.as_object().unwrap();
    assert_eq!(codes.len(), 5, "{codes:?}");
    for (call, code) in codes {
        assert_eq!(code, "PERMISSION_DENIED", "{call} with the agent's token");
    }
    served.stop().await;
}

#[tokio::test]
async fn killing_the_python_agent_leaves_no_os_process() {
    let Some(python) = python() else { return };
    let served = ExecKernel::start().await;
    let (pid, os_pid) = python_agent(&python, &served, "doomed").await;
    let mut admin = served.admin();
    assert!(os_alive(os_pid));
    assert_eq!(group_members(os_pid), [os_pid], "it leads its own group");

    let killed = client_py(&python, &served, &["kill", &pid.to_string()]).await;
    assert_eq!(killed.ok(), pid.to_string());
    // Kill returns once the OS process is gone, not before.
    assert!(!os_alive(os_pid), "OS process {os_pid} outlived its kill");
    assert!(group_members(os_pid).is_empty());
    let record = admin
        .wait_child(pb::WaitChildRequest { pid, timeout_ms: 1 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.exit_code, hivekernel_kernel::EXIT_KILLED);
    served.stop().await;
}

#[tokio::test]
async fn a_crash_of_the_python_agent_is_an_exit_with_its_status() {
    let Some(python) = python() else { return };
    let served = ExecKernel::start().await;
    let mut events = served.kernel.subscribe(None);
    let (pid, os_pid) = python_agent(&python, &served, "crasher").await;
    let mut admin = served.admin();

    client_py(&python, &served, &["send", &pid.to_string(), "exit 3"]).await;
    let record = collect(&mut admin, pid).await;
    assert_eq!((record.pid, record.exit_code), (pid, 3));
    assert_eq!(record.reason, "OS process exited with status 3");
    assert!(!os_alive(os_pid));

    let exited = tokio::time::timeout(STEP, async {
        loop {
            let event = events.live.recv().await.unwrap();
            if event.pid == Pid(pid) && event.kind.name() == "exited" {
                return event;
            }
        }
    })
    .await
    .unwrap();
    let detail = serde_json::to_value(&exited.kind).unwrap();
    assert_eq!(detail["exit_code"], 3, "{detail}");
    served.stop().await;
}

/// Spawns an exec agent that ignores SIGTERM and has a helper of its own:
/// (its PID, its OS PID, the helper's OS PID), once both run.
async fn spawn_stubborn(admin: &mut Client) -> (u64, u32, u32) {
    let pid = spawn_exec(
        admin,
        "stubborn",
        &[
            "sh",
            "-c",
            r#"trap '' TERM; sleep 600 & echo "os_pid=$$ helper=$!" >&2; wait"#,
        ],
    )
    .await;
    let log = log_of(admin, pid).await;
    wait_for_log(&log, "helper=").await;
    let os_pid: u32 = find_after(&log, "os_pid").unwrap().parse().unwrap();
    let helper: u32 = find_after(&log, "helper").unwrap().parse().unwrap();
    (pid, os_pid, helper)
}

/// Waits until `helper` (killed asynchronously) and the group led by `leader` are gone.
async fn group_gone(leader: u32, helper: u32) {
    wait_until("the helper to die", STEP, || async { !os_alive(helper) }).await;
    wait_until("the group to be empty", STEP, || async {
        group_members(leader).is_empty()
    })
    .await;
}

#[tokio::test]
async fn shutdown_leaves_no_os_process() {
    let Some(python) = python() else { return };
    let served = ExecKernel::start().await;
    let (_, python_os_pid) = python_agent(&python, &served, "py").await;
    let mut admin = served.admin();
    // One that ignores SIGTERM, with a helper of its own: both need SIGKILL.
    let (_, stubborn_os_pid, helper) = spawn_stubborn(&mut admin).await;
    assert!(os_alive(python_os_pid) && os_alive(stubborn_os_pid) && os_alive(helper));

    served.stop().await;
    // Leaders are reaped before shutdown returns; the helper dies of its
    // SIGKILL asynchronously.
    for os_pid in [python_os_pid, stubborn_os_pid] {
        assert!(!os_alive(os_pid), "OS process {os_pid} outlived the kernel");
    }
    group_gone(stubborn_os_pid, helper).await;
}

#[tokio::test]
async fn a_process_token_acts_only_as_its_process_and_dies_with_it() {
    let served = ExecKernel::start().await;
    let (pid, _log, _os_pid, token) = sleeper(&served, "holder").await;
    assert!(token.starts_with(&format!("p{pid}.")), "{token}");
    let mut me = served.client(&token);

    let own = me
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.name, "holder");
    let mut child = pb::SpawnRequest {
        parent: 1,
        name: "impostor".into(),
        runtime: "echo".into(),
        ..Default::default()
    };
    assert_code(
        me.spawn(child.clone()).await,
        Code::PermissionDenied,
        "only spawn its own",
    );
    child.parent = pid;
    let grandchild = me.spawn(child).await.unwrap().into_inner().pid;
    assert_code(
        me.send_message(pb::SendMessageRequest {
            to: grandchild,
            from: 1,
            payload: "x".into(),
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
        "caller's own pid",
    );
    assert_code(
        me.attach(pb::AttachRequest {
            pid: 1,
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
        "only attach to itself",
    );
    assert_code(
        me.wait_child(pb::WaitChildRequest { pid, timeout_ms: 1 })
            .await,
        Code::PermissionDenied,
        "not the parent",
    );
    assert_code(
        me.kill(pb::KillRequest {
            pid: 1,
            reason: String::new(),
        })
        .await,
        Code::PermissionDenied,
        "PID 1",
    );
    assert_code(
        complete(&mut me, 999, "x").await,
        Code::NotFound,
        "no pending task 999",
    );
    // The admin is not a process: it can neither attach nor answer.
    let mut admin = served.admin();
    assert_code(
        admin
            .attach(pb::AttachRequest {
                pid,
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
        "own token",
    );
    assert_code(
        complete(&mut admin, 1, "x").await,
        Code::PermissionDenied,
        "own token",
    );

    admin
        .kill(pb::KillRequest {
            pid,
            reason: String::new(),
        })
        .await
        .unwrap();
    assert_code(
        me.get_process(pb::GetProcessRequest { pid: 1 }).await,
        Code::Unauthenticated,
        "invalid token",
    );
    served.stop().await;
}

#[tokio::test]
async fn deliveries_wait_for_the_agent_and_a_new_attach_takes_over() {
    let served = ExecKernel::start().await;
    let (pid, _log, _os_pid, token) = sleeper(&served, "late").await;
    let mut admin = served.admin();
    // Sent before anyone attached: they wait.
    admin
        .send_message(pb::SendMessageRequest {
            to: pid,
            payload: "early note".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ask = |description: &str| {
        let mut admin = served.admin();
        let request = pb::ExecuteTaskRequest {
            pid,
            description: description.into(),
            ..Default::default()
        };
        tokio::spawn(async move { admin.execute_task(request).await.map(|r| r.into_inner()) })
    };
    let first = ask("early task");

    let mut me = served.client(&token);
    let mut stream = attach(&mut me).await;
    let mut task_id = 0;
    for _ in 0..2 {
        match next(&mut stream).await {
            Item::Task(task) => {
                assert_eq!((task.description.as_str(), task.from), ("early task", 1));
                assert!(task.deadline_unix_ms > 0);
                task_id = task.request_id;
            }
            Item::Message(message) => {
                assert_eq!((message.payload.as_str(), message.from), ("early note", 1));
                assert_eq!(ack(&mut me, &[message.message_id]).await, 1);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    complete(&mut me, task_id, "done early").await.unwrap();
    let reply = first.await.unwrap().unwrap();
    assert!(reply.success, "{reply:?}");
    assert_eq!(
        (reply.request_id, reply.output.as_str()),
        (task_id, "done early")
    );
    assert_code(
        complete(&mut me, task_id, "again").await,
        Code::NotFound,
        "no pending task",
    );

    // A task taken on one stream and not answered is sent again on the next.
    let second = ask("second task");
    let Item::Task(taken) = next(&mut stream).await else {
        panic!("expected the second task");
    };
    let mut replacement = attach(&mut me).await;
    let ended = tokio::time::timeout(STEP, stream.message()).await.unwrap();
    assert_code(ended, Code::Aborted, "newer Attach");
    let Item::Task(again) = next(&mut replacement).await else {
        panic!("expected the second task again");
    };
    assert_eq!(again.request_id, taken.request_id);
    complete(&mut me, again.request_id, "second done")
        .await
        .unwrap();
    assert_eq!(second.await.unwrap().unwrap().output, "second done");

    // Its process ends: so does the stream.
    admin
        .kill(pb::KillRequest {
            pid,
            reason: String::new(),
        })
        .await
        .unwrap();
    let end = tokio::time::timeout(STEP, replacement.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
    served.stop().await;
}

/// A message stays out until acknowledged: a new Attach gets it again, with
/// its id; acknowledged, it is not sent again. On an `auto_ack` stream a
/// message is done with once sent. At most `max_concurrent_tasks` are out
/// unacknowledged; the rest wait in the mailbox.
#[tokio::test]
async fn messages_are_delivered_until_acknowledged() {
    let served = ExecKernel::start().await;
    let (pid, _log, _os_pid, token) = sleeper(&served, "acker").await;
    let mut admin = served.admin();
    let send = |payload: String| {
        let mut admin = served.admin();
        async move {
            admin
                .send_message(pb::SendMessageRequest {
                    to: pid,
                    payload,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .message_id
        }
    };
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(send(format!("m{i}")).await);
    }
    let mut me = served.client(&token);
    let mut stream = attach(&mut me).await;
    let mut got = Vec::new();
    // max_concurrent_tasks is 4: four are out, two wait.
    for _ in 0..4 {
        let Item::Message(message) = next(&mut stream).await else {
            panic!("expected a message");
        };
        got.push(message.message_id);
    }
    assert_eq!(got, ids[..4]);
    let more = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
    assert!(more.is_err(), "a fifth went out unacknowledged: {more:?}");
    assert_eq!(
        admin
            .get_process(pb::GetProcessRequest { pid })
            .await
            .unwrap()
            .into_inner()
            .mailbox_len,
        2
    );

    // Two acknowledged (and one of them twice, and one unknown id): two more go out.
    assert_eq!(ack(&mut me, &[ids[0], ids[1], ids[1], 999_999]).await, 2);
    for expected in &ids[4..6] {
        let Item::Message(message) = next(&mut stream).await else {
            panic!("expected a message");
        };
        assert_eq!(message.message_id, *expected);
    }

    // A new stream gets the four never acknowledged again, same ids, in order.
    let mut replacement = attach(&mut me).await;
    let mut again = Vec::new();
    for _ in 0..4 {
        let Item::Message(message) = next(&mut replacement).await else {
            panic!("expected a message again");
        };
        again.push(message.message_id);
    }
    assert_eq!(again, ids[2..6]);
    assert_eq!(ack(&mut me, &ids[2..6]).await, 4);

    // auto_ack: done with once sent, nothing comes again.
    let mut auto = attach_with(&mut me, true).await;
    let id = send("auto".into()).await;
    let Item::Message(message) = next(&mut auto).await else {
        panic!("expected the message");
    };
    assert_eq!(message.message_id, id);
    assert_eq!(ack(&mut me, &[id]).await, 0, "nothing left to acknowledge");
    let mut last = attach(&mut me).await;
    let quiet = tokio::time::timeout(Duration::from_millis(300), last.message()).await;
    assert!(quiet.is_err(), "sent again: {quiet:?}");

    assert_code(
        me.ack_messages(pb::AckMessagesRequest {
            message_ids: (1..=10_001).collect(),
        })
        .await,
        Code::InvalidArgument,
        "message_ids has 10001 entries, at most 10000",
    );

    // Acknowledging is the process's own: the admin token cannot.
    assert_code(
        admin
            .ack_messages(pb::AckMessagesRequest {
                message_ids: vec![id],
            })
            .await,
        Code::PermissionDenied,
        "exec process",
    );
    served.stop().await;
}

#[tokio::test]
async fn task_deadlines_apply_before_the_agent_attaches() {
    let served = ExecKernel::start().await;
    let (pid, _log, _os_pid, token) = sleeper(&served, "slow").await;
    let mut admin = served.admin();
    let late = admin
        .execute_task(pb::ExecuteTaskRequest {
            pid,
            description: "too late".into(),
            timeout_ms: 200,
            ..Default::default()
        })
        .await;
    assert_code(late, Code::DeadlineExceeded, "no reply");
    admin
        .send_message(pb::SendMessageRequest {
            to: pid,
            payload: "after the deadline".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // The abandoned task is not handed to the agent; the message after it is.
    let mut me = served.client(&token);
    let mut stream = attach(&mut me).await;
    match next(&mut stream).await {
        Item::Message(message) => assert_eq!(message.payload, "after the deadline"),
        other => panic!("expected the message, got {other:?}"),
    }
    served.stop().await;
}

#[tokio::test]
async fn an_agent_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let (pid, os_pid, helper) = spawn_stubborn(&mut admin).await;
    assert_eq!(group_members(os_pid).len(), 2);

    let started = Instant::now();
    let killed = served
        .kernel
        .kill(Caller::Admin, Pid(pid), "")
        .await
        .unwrap();
    assert_eq!(killed.exited, [Pid(pid)]);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "SIGKILL came before the grace period: {:?}",
        started.elapsed()
    );
    // The leader is reaped before kill returns; a helper dies of its SIGKILL
    // asynchronously, and its zombie is reaped by whoever adopted it.
    assert!(!os_alive(os_pid));
    group_gone(os_pid, helper).await;
    served.stop().await;
}

#[tokio::test]
async fn an_os_exit_is_a_kernel_exit_with_its_status_or_signal() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let cases: [(&str, i32, &str); 3] = [
        ("exit 0", 0, "exited with status 0"),
        ("echo failing >&2; exit 3", 3, "exited with status 3"),
        ("kill -KILL $$", 137, "killed by signal 9 (SIGKILL)"),
    ];
    for (script, code, reason) in cases {
        let pid = spawn_exec(&mut admin, "short", &["sh", "-c", script]).await;
        let record = collect(&mut admin, pid).await;
        assert_eq!(record.exit_code, code, "{script}: {record:?}");
        assert!(record.reason.contains(reason), "{script}: {record:?}");
    }
    let logs = served.data_dir().join("logs");
    let failing = std::fs::read_dir(&logs)
        .unwrap()
        .filter_map(|entry| std::fs::read_to_string(entry.unwrap().path()).ok())
        .any(|log| log.contains("failing"));
    assert!(failing, "the stderr of an exec process goes to its log");
    served.stop().await;
}

#[tokio::test]
async fn bad_commands_are_refused_with_invalid_argument() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let spawn = |runtime: &str, command: &[&str], env: &[(&str, &str)]| pb::SpawnRequest {
        parent: 1,
        name: "bad".into(),
        runtime: runtime.into(),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    let cases = [
        (spawn("exec", &[], &[]), "needs a command"),
        (
            spawn("exec", &["sh", "a\0b"], &[]),
            "command[1] contains a NUL",
        ),
        (spawn("exec", &["./agent.py"], &[]), "relative path"),
        (
            spawn("exec", &["no-such-program-hk"], &[]),
            "not found in PATH",
        ),
        (
            spawn("exec", &["sh"], &[("HIVEKERNEL_TOKEN", "x")]),
            "set by the kernel",
        ),
        (spawn("echo", &["sh"], &[]), "only for runtime exec"),
    ];
    for (request, needle) in cases {
        assert_code(admin.spawn(request).await, Code::InvalidArgument, needle);
    }
    // Nothing was started for any of them.
    assert_eq!(served.kernel.live_count(), 1);
    // A command alone implies runtime exec.
    let implied = admin
        .spawn(spawn("", &["sh", "-c", "exec sleep 600"], &[]))
        .await
        .unwrap()
        .into_inner()
        .pid;
    let info = admin
        .get_process(pb::GetProcessRequest { pid: implied })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.runtime, "exec");
    served.stop().await;
}

/// `policy`, at most `max_restarts` within 60 s, backoff from 100 ms to 1 s.
fn restart_spec(policy: pb::RestartPolicy, max_restarts: u32) -> pb::RestartSpec {
    pb::RestartSpec {
        policy: policy as i32,
        max_restarts: Some(max_restarts),
        within_seconds: Some(60),
        backoff_ms: vec![100, 1000],
    }
}

/// Spawns an exec process under PID 1 with a restart spec; its PID and log.
async fn spawn_supervised(
    client: &mut Client,
    name: &str,
    command: &[&str],
    restart: pb::RestartSpec,
) -> (u64, PathBuf) {
    let pid = client
        .spawn(pb::SpawnRequest {
            parent: 1,
            name: name.into(),
            runtime: "exec".into(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            restart: Some(restart),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .pid;
    (pid, log_of(client, pid).await)
}

/// The supervision events about `pid` (on it, or an escalation naming it),
/// until and including the first of kind `last`: each as its kind, attempt,
/// delay and whether it is manual, the rest left out so two kinds of
/// process compare.
async fn timeline(
    events: &mut hivekernel_kernel::events::Live,
    pid: Pid,
    last: &str,
) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    tokio::time::timeout(STEP, async {
        loop {
            let event = events.recv().await.unwrap();
            let detail = serde_json::to_value(&event.kind).unwrap();
            let about = event.pid == pid || detail["child"] == pid.0;
            let kind = event.kind.name();
            if !about || !["exited", "restarted", "escalated"].contains(&kind) {
                continue;
            }
            seen.push(serde_json::json!({
                "kind": kind,
                "attempt": detail["attempt"],
                "delay_ms": detail["delay_ms"],
                "restarts": detail["restarts"],
            }));
            if kind == last {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {last} event for {pid}; saw {seen:#?}"));
    seen
}

/// Every value of `key` in the log at `path`, in order.
fn all_after(path: &Path, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.match_indices(key)
        .map(|(at, _)| {
            text[at + key.len()..]
                .trim_start_matches('=')
                .chars()
                .take_while(|c| !c.is_whitespace())
                .collect()
        })
        .collect()
}

/// A `permanent` exec agent that keeps exiting non-zero is restarted with
/// the backoff, each time as a new OS process with a fresh token, then
/// escalates at its intensity: the same timeline as an in-process agent
/// with the same restart spec.
#[tokio::test]
async fn a_failing_exec_agent_restarts_with_backoff_then_escalates_like_an_in_process_one() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let mut events = served.kernel.subscribe(None).live;
    let crashy = r#"echo "started token=$HIVEKERNEL_TOKEN" >&2; sleep 0.2; exit 3"#;
    let spec = restart_spec(pb::RestartPolicy::Permanent, 2);
    let (pid, log) = spawn_supervised(&mut admin, "crashy", &["sh", "-c", crashy], spec).await;
    let exec_timeline = timeline(&mut events, Pid(pid), "escalated").await;

    let record = collect(&mut admin, pid).await;
    assert_eq!(record.exit_code, 3, "{record:?}");
    let tokens = all_after(&log, "token");
    assert_eq!(tokens.len(), 3, "three OS processes: {tokens:?}");
    assert!(
        tokens[0] != tokens[1] && tokens[1] != tokens[2] && tokens[0] != tokens[2],
        "each with its own token: {tokens:?}"
    );
    for token in &tokens {
        let refused = served
            .client(token)
            .list_processes(pb::ListProcessesRequest::default())
            .await;
        assert_code(refused, Code::Unauthenticated, "");
    }

    // The same spec on an in-process agent, crashed each time it is back.
    let mut request =
        hivekernel_tests::probe_request(Pid::KERNEL, "inproc", hivekernel_agents::Role::Worker);
    request.restart = Some(hivekernel_agents::RestartSpec {
        policy: hivekernel_agents::RestartPolicy::Permanent,
        max_restarts: 2,
        within_seconds: 60,
        backoff_ms: [100, 1000],
    });
    let inproc = served.kernel.spawn(Caller::Admin, request).await.unwrap();
    let mut inproc_timeline = Vec::new();
    for _ in 0..3 {
        served
            .kernel
            .send_message(
                Caller::Admin,
                hivekernel_agents::Outgoing::new(inproc, "crash"),
            )
            .await
            .unwrap();
        let last = if inproc_timeline.len() < 4 {
            "restarted"
        } else {
            "escalated"
        };
        inproc_timeline.extend(timeline(&mut events, inproc, last).await);
    }
    assert_eq!(exec_timeline, inproc_timeline);
    let delays: Vec<_> = exec_timeline
        .iter()
        .map(|e| e["delay_ms"].clone())
        .collect();
    assert_eq!(
        delays,
        [
            serde_json::Value::Null,
            100.into(),
            serde_json::Value::Null,
            200.into(),
            serde_json::Value::Null,
            serde_json::Value::Null,
        ],
        "{exec_timeline:#?}"
    );
    assert_eq!(exec_timeline[5]["restarts"], 2, "{exec_timeline:#?}");
    served.stop().await;
}

/// An exec agent restarted after its OS process died (and by `restart`)
/// keeps its PID, gets a fresh token (the old one no longer works), and is
/// sent again the task and the message it had taken and not answered, and
/// what was sent while it was down.
#[tokio::test]
async fn a_restarted_exec_agent_gets_a_fresh_token_and_its_unanswered_work_again() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let spec = restart_spec(pb::RestartPolicy::Transient, 5);
    let (pid, log) = spawn_supervised(&mut admin, "phoenix", &["sh", "-c", SLEEPER], spec).await;
    wait_for_log(&log, "os_pid=").await;
    let first_os: u32 = find_after(&log, "os_pid").unwrap().parse().unwrap();
    let first_token = find_after(&log, "token").unwrap();

    let mut me = served.client(&first_token);
    let mut stream = attach(&mut me).await;
    let task = {
        let mut admin = served.admin();
        let request = pb::ExecuteTaskRequest {
            pid,
            description: "survive this".into(),
            ..Default::default()
        };
        tokio::spawn(async move { admin.execute_task(request).await.map(|r| r.into_inner()) })
    };
    let send = |payload: &str| {
        let mut admin = served.admin();
        let request = pb::SendMessageRequest {
            to: pid,
            payload: payload.into(),
            ..Default::default()
        };
        async move { admin.send_message(request).await.unwrap() }
    };
    send("before").await;
    let mut taken = Vec::new();
    for _ in 0..2 {
        taken.push(match next(&mut stream).await {
            Item::Task(task) => (task.request_id, task.description),
            Item::Message(message) => (message.message_id, message.payload),
            other => panic!("unexpected {other:?}"),
        });
    }
    taken.sort();

    // The OS process dies; the kernel process waits out its backoff.
    let mut events = served.kernel.subscribe(None).live;
    std::process::Command::new("kill")
        .args(["-9", &first_os.to_string()])
        .status()
        .unwrap();
    send("while down").await;
    let seen = timeline(&mut events, Pid(pid), "restarted").await;
    assert_eq!(seen[0]["kind"], "exited", "{seen:#?}");
    wait_until("the next OS process", STEP, || async {
        all_after(&log, "os_pid").len() == 2
    })
    .await;
    let second_token = all_after(&log, "token").pop().unwrap();
    assert_ne!(second_token, first_token);
    assert!(!os_alive(first_os));
    assert_code(
        me.attach(pb::AttachRequest::default()).await,
        Code::Unauthenticated,
        "",
    );
    let info = admin
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.restarts, 1, "{info:?}");
    assert_ne!(info.state, pb::ProcessState::Restarting as i32, "{info:?}");
    assert_eq!(info.last_exit.map(|e| e.exit_code), Some(137));

    // What it had taken comes again, in order, then what came meanwhile.
    let mut me = served.client(&second_token);
    let mut stream = attach(&mut me).await;
    let mut again = Vec::new();
    for _ in 0..3 {
        again.push(match next(&mut stream).await {
            Item::Task(task) => (task.request_id, task.description),
            Item::Message(message) => {
                assert_eq!(ack(&mut me, &[message.message_id]).await, 1);
                (message.message_id, message.payload)
            }
            other => panic!("unexpected {other:?}"),
        });
    }
    let later = again.pop().unwrap();
    again.sort();
    assert_eq!(again, taken);
    assert_eq!(later.1, "while down");
    let request_id = taken
        .iter()
        .find(|(_, what)| what == "survive this")
        .unwrap()
        .0;
    complete(&mut me, request_id, "answered by the second")
        .await
        .unwrap();
    let reply = task.await.unwrap().unwrap();
    assert_eq!(reply.output, "answered by the second");

    // A manual restart: the same again, at once, not counted against intensity.
    let second_os: u32 = all_after(&log, "os_pid").pop().unwrap().parse().unwrap();
    let restarted = admin
        .restart_process(pb::RestartProcessRequest {
            pid,
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((restarted.pid, restarted.attempt), (pid, 2));
    wait_until("the third OS process", STEP, || async {
        all_after(&log, "os_pid").len() == 3
    })
    .await;
    wait_until("the second OS process gone", STEP, || async {
        !os_alive(second_os)
    })
    .await;
    let third_token = all_after(&log, "token").pop().unwrap();
    let mut me = served.client(&third_token);
    let _stream = attach(&mut me).await;
    served.stop().await;
}

/// An exec agent whose program is gone by its restart exits with 127 and
/// the reason, and that failure counts: here it escalates.
#[tokio::test]
async fn an_exec_command_that_can_no_longer_start_exits_127_and_counts_as_a_failure() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("agent.sh");
    std::fs::write(&program, format!("#!/bin/sh\n{SLEEPER}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let program = program.to_str().unwrap().to_owned();
    let spec = restart_spec(pb::RestartPolicy::Permanent, 1);
    let (pid, log) = spawn_supervised(&mut admin, "vanishing", &[&program], spec).await;
    wait_for_log(&log, "os_pid=").await;
    let os_pid = find_after(&log, "os_pid").unwrap();
    std::fs::remove_file(&program).unwrap();
    let mut events = served.kernel.subscribe(None).live;
    std::process::Command::new("kill")
        .args(["-9", &os_pid])
        .status()
        .unwrap();
    let seen = timeline(&mut events, Pid(pid), "escalated").await;
    let kinds: Vec<_> = seen.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["exited", "restarted", "exited", "escalated"],
        "{seen:#?}"
    );
    let record = collect(&mut admin, pid).await;
    assert_eq!(record.exit_code, 127, "{record:?}");
    assert!(
        record.reason.contains("cannot start") && record.reason.contains("agent.sh"),
        "{record:?}"
    );
    served.stop().await;
}

/// A message that makes its agent exit is sent again to the restarted
/// agent once; when that one exits on it too, it is given up, and the
/// third agent carries on: no crash loop of the message's making.
#[tokio::test]
async fn a_message_that_kills_its_agent_twice_is_given_up() {
    let Some(python) = python() else { return };
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let mut events = served.kernel.subscribe(None).live;
    let agent = hivekernel_tests::exec::python_examples().join("echo_agent.py");
    let command = [python.to_str().unwrap(), agent.to_str().unwrap()];
    let spec = restart_spec(pb::RestartPolicy::Permanent, 3);
    let (pid, log) = spawn_supervised(&mut admin, "poisoned", &command, spec).await;
    wait_for_log(&log, "attached as poisoned").await;
    admin
        .send_message(pb::SendMessageRequest {
            to: pid,
            payload: "exit 3".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let seen = timeline(&mut events, Pid(pid), "restarted").await;
    let again = timeline(&mut events, Pid(pid), "restarted").await;
    assert_eq!(
        (
            seen[0]["kind"].as_str(),
            again[0]["kind"].as_str(),
            again[1]["attempt"].as_u64()
        ),
        (Some("exited"), Some("exited"), Some(2)),
        "{seen:#?} {again:#?}"
    );
    // The third agent is not sent it: it answers, and nothing exits again.
    let reply = admin
        .execute_task(pb::ExecuteTaskRequest {
            pid,
            description: "still here".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.output, "echo: still here", "{reply:?}");
    let info = admin
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.restarts, 2, "{info:?}");
    assert!(info.exit.is_none(), "{info:?}");
    served.stop().await;
}

/// What an agent took counts as lost only with an OS process that had it:
/// one that died before attaching did not, so the task still reaches the
/// third. A process may not choose its children's working directory.
#[tokio::test]
async fn only_an_os_process_that_took_a_task_counts_against_it() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let spec = restart_spec(pb::RestartPolicy::Permanent, 5);
    let (pid, log) = spawn_supervised(&mut admin, "patient", &["sh", "-c", SLEEPER], spec).await;
    let started = |n: usize| {
        let log = log.clone();
        async move {
            wait_until("the next OS process", STEP, || async {
                all_after(&log, "os_pid").len() == n
            })
            .await;
            let os_pid: u32 = all_after(&log, "os_pid").pop().unwrap().parse().unwrap();
            (os_pid, all_after(&log, "token").pop().unwrap())
        }
    };
    let kill_9 = |os_pid: u32| {
        std::process::Command::new("kill")
            .args(["-9", &os_pid.to_string()])
            .status()
            .unwrap();
    };
    let (first, token) = started(1).await;
    let mut me = served.client(&token);
    let mut stream = attach(&mut me).await;
    let task = {
        let mut admin = served.admin();
        let request = pb::ExecuteTaskRequest {
            pid,
            description: "outlive two".into(),
            ..Default::default()
        };
        tokio::spawn(async move { admin.execute_task(request).await.map(|r| r.into_inner()) })
    };
    let Item::Task(taken) = next(&mut stream).await else {
        panic!("expected the task");
    };
    kill_9(first);
    // The second never attaches: it was handed nothing.
    let (second, _) = started(2).await;
    kill_9(second);
    let (_, token) = started(3).await;
    let mut me = served.client(&token);
    let mut stream = attach(&mut me).await;
    let Item::Task(again) = next(&mut stream).await else {
        panic!("expected the task again");
    };
    assert_eq!(again.request_id, taken.request_id);
    complete(&mut me, again.request_id, "made it")
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap().output, "made it");

    let refused = me
        .spawn(pb::SpawnRequest {
            parent: pid,
            name: "elsewhere".into(),
            command: vec!["sh".into(), "-c".into(), "sleep 1".into()],
            cwd: "/".into(),
            ..Default::default()
        })
        .await;
    assert_code(refused, Code::PermissionDenied, "working directory");
    served.stop().await;
}

/// An agent's log grows past `kernel.exec.log.max_bytes`: it is copied to
/// `.1` (older ones moving up, the oldest beyond `keep` dropped) and
/// truncated, and the agent, writing in append mode, carries on at its
/// start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_agents_log_is_rotated_by_size_keeping_the_newest_files() {
    use hivekernel_kernel::exec::LogRotation;
    let served = ExecKernel::start_with(|runtime| {
        runtime.with_log_rotation(LogRotation {
            max_bytes: 64 * 1024,
            keep: 2,
        })
    })
    .await;
    let mut admin = served.admin();
    // Three generations of 100 kB, each written once the one before was
    // rotated away (its stdout, the log, is back to empty).
    let script = r#"for c in a b c; do
          head -c 100000 /dev/zero | tr '\0' "$c"; echo
          while [ "$(stat -L -c %s /proc/$$/fd/1)" -gt 1000 ]; do sleep 0.1; done
        done
        echo done
        exec sleep 600"#;
    let pid = spawn_exec(&mut admin, "chatty", &["/bin/sh", "-c", script]).await;
    let log = log_of(&mut admin, pid).await;
    let rotated = |n: u32| PathBuf::from(format!("{}.{n}", log.display()));
    wait_for_log(&log, "done").await;
    let generation = |n: u32| std::fs::read_to_string(rotated(n)).unwrap();
    assert_eq!(generation(1), format!("{}\n", "c".repeat(100_000)));
    assert_eq!(generation(2), format!("{}\n", "b".repeat(100_000)));
    assert!(!rotated(3).exists(), "keep 2: the oldest was dropped");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "done\n");
    served.stop().await;
}

#[tokio::test]
async fn an_exec_agents_log_is_read_through_the_kernel_its_tail_or_from_an_offset() {
    let served = ExecKernel::start().await;
    let mut admin = served.admin();
    let (pid, log, _, token) = sleeper(&served, "logger").await;
    let written = std::fs::read_to_string(&log).unwrap();
    let read = |offset: u64, tail: bool, max_bytes: u64| pb::ReadLogRequest {
        pid,
        offset,
        tail,
        max_bytes,
    };
    let whole = admin
        .read_log(read(0, false, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(whole.text, written);
    assert_eq!((whole.offset, whole.size), (0, written.len() as u64));
    let tail = admin.read_log(read(0, true, 8)).await.unwrap().into_inner();
    assert_eq!(tail.text, written[written.len() - 8..]);
    assert_eq!(tail.offset, written.len() as u64 - 8);
    // From where the last read ended: nothing new yet; past the end (a
    // rotation happened meanwhile): from the start again.
    let next = admin
        .read_log(read(whole.size, false, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((next.text.as_str(), next.size), ("", whole.size));
    let past = admin
        .read_log(read(whole.size + 100, false, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((past.offset, past.text), (0, written.clone()));

    // Only for exec agents, and only for those who may read it.
    let other = spawn_exec(&mut admin, "other", &["sh", "-c", "exec sleep 600"]).await;
    let echo = admin
        .spawn(pb::SpawnRequest {
            parent: 1,
            name: "plain".into(),
            runtime: "echo".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .pid;
    assert_code(
        admin
            .read_log(pb::ReadLogRequest {
                pid: echo,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "no log file",
    );
    let mut own = served.client(&token);
    assert_eq!(
        own.read_log(read(0, false, 0))
            .await
            .unwrap()
            .into_inner()
            .text,
        written
    );
    assert_code(
        own.read_log(pb::ReadLogRequest {
            pid: other,
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
        "its own log",
    );
    assert_code(
        admin
            .read_log(pb::ReadLogRequest {
                pid: 999_999,
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "999999",
    );
    served.stop().await;
}
