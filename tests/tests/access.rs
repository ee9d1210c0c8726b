//! Who sees and does what over gRPC: a process token's view of the event
//! log, operator tokens and their scopes (created, used, revoked, expired,
//! kept across a restart). A real kernel, its real gRPC server on loopback
//! and, for durability, a real SQLite file.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hivekernel_agents::{Pid, Role};
use hivekernel_kernel::Caller;
use hivekernel_kernel::caller::Scope;
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::kernel::NewToken;
use hivekernel_proto::v1 as pb;
use hivekernel_tests::durable::Durable;
use hivekernel_tests::served::{Client, Served};
use hivekernel_tests::{kernel_with, spawn_probe, test_settings};
use tokio_stream::StreamExt;
use tonic::{Code, Status, Streaming};

const ROOT: Pid = Pid::KERNEL;

#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, says: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(says),
        "{status:?} should say {says:?}"
    );
}

async fn next(events: &mut Streaming<pb::Event>) -> pb::Event {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within 10 s")
        .expect("the stream goes on")
        .unwrap()
}

/// Every event of `client`'s replay from the start, up to the `replay_done`
/// marker, and the stream to read live events from.
async fn replay(client: Client) -> (Vec<pb::Event>, Streaming<pb::Event>) {
    let request = pb::SubscribeEventsRequest {
        since_seq: 0,
        replay: true,
        ..Default::default()
    };
    replay_of(client, request).await
}

/// [`replay`] of what `request` asks for.
async fn replay_of(
    mut client: Client,
    request: pb::SubscribeEventsRequest,
) -> (Vec<pb::Event>, Streaming<pb::Event>) {
    let mut events = client.subscribe_events(request).await.unwrap().into_inner();
    let mut replayed = Vec::new();
    loop {
        let event = next(&mut events).await;
        if event.r#type == "replay_done" {
            return (replayed, events);
        }
        replayed.push(event);
    }
}

async fn create(client: &mut Client, name: &str, scope: pb::TokenScope, secs: u64) -> String {
    client
        .create_token(pb::CreateTokenRequest {
            name: name.into(),
            scope: scope.into(),
            expires_in_seconds: secs,
        })
        .await
        .unwrap()
        .into_inner()
        .secret
}

/// `a` (a lead) with `a1` under it and `a1x` under that, killed; `b`
/// beside `a`.
async fn two_trees(kernel: &hivekernel_kernel::Kernel) -> [Pid; 4] {
    let a = spawn_probe(kernel, ROOT, "a", Role::Lead).await;
    let a1 = spawn_probe(kernel, a, "a1", Role::Lead).await;
    let b = spawn_probe(kernel, ROOT, "b", Role::Lead).await;
    let a1x = spawn_probe(kernel, a1, "a1x", Role::Worker).await;
    kernel.kill(Caller::Admin, a1x, "gone").await.unwrap();
    [a, a1, b, a1x]
}

#[tokio::test]
async fn a_process_token_sees_only_events_of_its_own_subtree() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let [a, a1, b, a1x] = two_trees(&kernel).await;
    let token = served.auth.issue(a).unwrap();

    // The replay: a's own events and those of its descendants, the one
    // already reaped included; nothing of PID 1 or b.
    let (replayed, mut events) = replay(served.with_token(&token)).await;
    let seen: Vec<(u64, String)> = replayed.into_iter().map(|e| (e.pid, e.r#type)).collect();
    assert!(seen.contains(&(a.0, "spawned".into())), "{seen:?}");
    assert!(seen.contains(&(a1.0, "spawned".into())), "{seen:?}");
    assert!(seen.contains(&(a1x.0, "spawned".into())), "{seen:?}");
    assert!(seen.contains(&(a1x.0, "exited".into())), "{seen:?}");
    assert!(
        seen.iter().all(|(pid, _)| [a.0, a1.0, a1x.0].contains(pid)),
        "only a's subtree: {seen:?}"
    );

    // Live: b's new child comes first and is not shown; a's is, and so is
    // what happens to it after.
    spawn_probe(&kernel, b, "b1", Role::Worker).await;
    let a2 = spawn_probe(&kernel, a1, "a2", Role::Worker).await;
    let event = next(&mut events).await;
    assert_eq!((event.pid, event.r#type.as_str()), (a2.0, "spawned"));
    kernel
        .send_message(Caller::Admin, hivekernel_agents::Outgoing::new(b, "psst"))
        .await
        .ok();
    kernel.kill(Caller::Admin, a2, "done").await.unwrap();
    let event = next(&mut events).await;
    assert_eq!((event.pid, event.r#type.as_str()), (a2.0, "exited"));

    // The admin sees b's events in the same log.
    let (replayed, _) = replay(served.admin()).await;
    let pids: Vec<u64> = replayed.iter().map(|e| e.pid).collect();
    assert!(pids.contains(&b.0) && pids.contains(&a.0), "{pids:?}");
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn a_process_token_lists_its_own_subtree_unless_it_names_a_root() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let [a, a1, b, _] = two_trees(&kernel).await;
    let token = served.auth.issue(a).unwrap();
    let listed = |mut client: Client, root: u64| async move {
        let mut stream = client
            .list_processes(pb::ListProcessesRequest {
                root,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut pids = Vec::new();
        while let Some(batch) = stream.next().await {
            pids.extend(batch.unwrap().processes.iter().map(|p| p.pid));
        }
        pids
    };
    // No root: its own subtree, as the docs say.
    let own = listed(served.with_token(&token), 0).await;
    assert_eq!(own[..2], [a.0, a1.0], "{own:?}");
    assert!(!own.contains(&ROOT.0) && !own.contains(&b.0), "{own:?}");
    // The admin's default is the whole table.
    let all = listed(served.admin(), 0).await;
    assert!(all.contains(&ROOT.0) && all.contains(&b.0), "{all:?}");
    // A root it names is listed.
    assert_eq!(listed(served.with_token(&token), b.0).await, vec![b.0]);
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn the_kernel_filters_a_stream_by_process_subtree_type_and_tail() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let [a, a1, b, a1x] = two_trees(&kernel).await;
    let pairs = |events: &[pb::Event]| -> Vec<(u64, String)> {
        events.iter().map(|e| (e.pid, e.r#type.clone())).collect()
    };

    // a's subtree, spawns only: the one reaped since included.
    let spawns = pb::SubscribeEventsRequest {
        replay: true,
        pid: a.0,
        subtree: true,
        types: vec!["spawned".into()],
        ..Default::default()
    };
    let (replayed, mut live) = replay_of(served.admin(), spawns).await;
    let spawned = |pid: Pid| (pid.0, "spawned".to_owned());
    assert_eq!(pairs(&replayed), [spawned(a), spawned(a1), spawned(a1x)]);
    // Live: b's child and a2's exit are not asked for; a2's spawn is.
    spawn_probe(&kernel, b, "b1", Role::Worker).await;
    let a2 = spawn_probe(&kernel, a1, "a2", Role::Worker).await;
    kernel.kill(Caller::Admin, a2, "done").await.unwrap();
    let a3 = spawn_probe(&kernel, a1, "a3", Role::Worker).await;
    assert_eq!(pairs(&[next(&mut live).await]), [spawned(a2)]);
    assert_eq!(pairs(&[next(&mut live).await]), [spawned(a3)]);

    // The newest N of what matches, and of everything: the last N of a
    // whole replay read after it, up to where it ended.
    let tail = |tail: u64, pid: Pid| pb::SubscribeEventsRequest {
        pid: pid.0,
        subtree: pid != Pid(0),
        tail,
        ..Default::default()
    };
    let (of_a, _) = replay_of(served.admin(), tail(2, a)).await;
    let (everything, _) = replay_of(served.admin(), tail(3, Pid(0))).await;
    let (all, _) = replay(served.admin()).await;
    let newest = |events: &[pb::Event], wanted: &dyn Fn(&pb::Event) -> bool, n: usize| {
        let end = events.last().unwrap().seq;
        let matching: Vec<pb::Event> = all
            .iter()
            .filter(|e| e.seq <= end && wanted(e))
            .cloned()
            .collect();
        matching[matching.len() - n..].to_vec()
    };
    let subtree = [a.0, a1.0, a1x.0, a2.0, a3.0];
    assert_eq!(of_a, newest(&of_a, &|e| subtree.contains(&e.pid), 2));
    assert_eq!(everything, newest(&everything, &|_| true, 3));
    // A process alone, not its children.
    let only_b = pb::SubscribeEventsRequest {
        replay: true,
        pid: b.0,
        ..Default::default()
    };
    let (replayed, _) = replay_of(served.admin(), only_b).await;
    assert!(!replayed.is_empty() && replayed.iter().all(|e| e.pid == b.0));

    // Bad requests are refused by name.
    let refusals = [
        (
            pb::SubscribeEventsRequest {
                types: vec!["spawnd".into()],
                ..Default::default()
            },
            Code::InvalidArgument,
            "unknown event type \"spawnd\"",
        ),
        (
            pb::SubscribeEventsRequest {
                trace_id: "not-a-trace".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "trace_id",
        ),
        (
            pb::SubscribeEventsRequest {
                tail: 1 << 40,
                ..Default::default()
            },
            Code::InvalidArgument,
            "tail",
        ),
        (
            pb::SubscribeEventsRequest {
                subtree: true,
                ..Default::default()
            },
            Code::InvalidArgument,
            "subtree needs the pid",
        ),
    ];
    for (request, code, says) in refusals {
        refused(served.admin().subscribe_events(request).await, code, says);
    }
    // A process asks only for its own subtree's events.
    let token = served.auth.issue(a1).unwrap();
    let outside = pb::SubscribeEventsRequest {
        pid: b.0,
        ..Default::default()
    };
    refused(
        served.with_token(&token).subscribe_events(outside).await,
        Code::PermissionDenied,
        "may only watch",
    );
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn operator_tokens_may_do_what_their_scope_allows_and_no_more() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let victim = spawn_probe(&kernel, ROOT, "victim", Role::Agent).await;
    let mut admin = served.admin();
    let read = create(&mut admin, "grafana", pb::TokenScope::Read, 0).await;
    let operate = create(&mut admin, "oncall", pb::TokenScope::Operate, 0).await;
    assert!(
        read.starts_with("o1.") && operate.starts_with("o2."),
        "{read} {operate}"
    );

    // read: lists, describes and watches; may not act.
    let mut reader = served.with_token(&read);
    let listed = reader
        .get_process(pb::GetProcessRequest { pid: victim.0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.name, "victim");
    reader
        .subscribe_events(pb::SubscribeEventsRequest::default())
        .await
        .unwrap();
    let kill = pb::KillRequest {
        pid: victim.0,
        reason: "no".into(),
    };
    refused(
        reader.kill(kill.clone()).await,
        Code::PermissionDenied,
        "Kill needs the operate scope",
    );
    refused(
        reader
            .spawn(pb::SpawnRequest {
                parent: 1,
                name: "x".into(),
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
        "Spawn needs the operate scope",
    );
    assert!(kernel.get_process(Caller::Admin, victim).await.is_ok());

    // operate: acts; may not change tokens or the config.
    let mut operator = served.with_token(&operate);
    refused(
        operator.list_tokens(pb::ListTokensRequest::default()).await,
        Code::PermissionDenied,
        "ListTokens needs the admin scope",
    );
    refused(
        operator
            .create_token(pb::CreateTokenRequest {
                name: "mine".into(),
                scope: pb::TokenScope::Admin.into(),
                expires_in_seconds: 0,
            })
            .await,
        Code::PermissionDenied,
        "needs the admin scope",
    );
    refused(
        operator
            .reload_config(pb::ReloadConfigRequest::default())
            .await,
        Code::PermissionDenied,
        "ReloadConfig needs the admin scope",
    );
    let killed = operator.kill(kill).await.unwrap().into_inner().killed;
    assert_eq!(killed, [victim.0]);

    // A process token may not manage tokens either.
    let worker = spawn_probe(&kernel, ROOT, "w", Role::Agent).await;
    let mut process = served.with_token(&served.auth.issue(worker).unwrap());
    refused(
        process.list_tokens(pb::ListTokensRequest::default()).await,
        Code::PermissionDenied,
        "ListTokens needs the admin scope",
    );

    // Revoked: refused from the next call on, and listed as revoked.
    let revoked = admin
        .revoke_token(pb::RevokeTokenRequest {
            token: "grafana".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((revoked.id, revoked.status.as_str()), (1, "revoked"));
    refused(
        reader.get_process(pb::GetProcessRequest { pid: 1 }).await,
        Code::Unauthenticated,
        "\"grafana\" was revoked",
    );
    let listed = admin
        .list_tokens(pb::ListTokensRequest { all: false })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(
        listed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["oncall"]
    );
    let every = admin
        .list_tokens(pb::ListTokensRequest { all: true })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(every.len(), 2);

    // Bad input changes nothing.
    refused(
        admin
            .revoke_token(pb::RevokeTokenRequest {
                token: "grafana".into(),
            })
            .await,
        Code::FailedPrecondition,
        "already revoked",
    );
    refused(
        admin
            .revoke_token(pb::RevokeTokenRequest {
                token: "nobody".into(),
            })
            .await,
        Code::NotFound,
        "no token \"nobody\"",
    );
    for (name, scope, code, says) in [
        (
            "bad name",
            pb::TokenScope::Read as i32,
            Code::InvalidArgument,
            "invalid token name",
        ),
        ("ok", 0, Code::InvalidArgument, "scope must be"),
        ("ok", 9, Code::InvalidArgument, "scope must be"),
        (
            "oncall",
            pb::TokenScope::Read as i32,
            Code::FailedPrecondition,
            "exists",
        ),
    ] {
        refused(
            admin
                .create_token(pb::CreateTokenRequest {
                    name: name.into(),
                    scope,
                    expires_in_seconds: 0,
                })
                .await,
            code,
            says,
        );
    }
    let after = admin
        .list_tokens(pb::ListTokensRequest { all: true })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(after, every, "refused changes changed nothing");

    // Every change is an event naming who made it.
    let changes: Vec<(String, String, String)> = kernel
        .subscribe(Some(0))
        .replay
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Token {
                action, name, by, ..
            } => Some((action.clone(), name.clone(), by.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("created".into(), "grafana".into(), "admin".into()),
            ("created".into(), "oncall".into(), "admin".into()),
            ("revoked".into(), "grafana".into(), "admin".into()),
        ]
    );
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn an_expired_token_is_refused() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let brief = create(&mut served.admin(), "brief", pb::TokenScope::Read, 1).await;
    let mut client = served.with_token(&brief);
    client
        .get_process(pb::GetProcessRequest { pid: 1 })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    refused(
        client.get_process(pb::GetProcessRequest { pid: 1 }).await,
        Code::Unauthenticated,
        "\"brief\" has expired",
    );
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn tokens_survive_a_restart_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let first = Durable::start(dir.path(), test_settings()).await;
    let keep = NewToken {
        name: Some("ci".into()),
        scope: Scope::Operate,
        expires_in: None,
    };
    let (kept, secret) = first
        .kernel
        .tokens()
        .create(Caller::Admin, keep)
        .await
        .unwrap();
    let gone = NewToken {
        name: Some("old".into()),
        scope: Scope::Read,
        expires_in: None,
    };
    let (gone, _) = first
        .kernel
        .tokens()
        .create(Caller::Admin, gone)
        .await
        .unwrap();
    first
        .kernel
        .tokens()
        .revoke(Caller::Admin, "old")
        .await
        .unwrap();
    first.kernel.shutdown().await;

    let second = Durable::start(dir.path(), test_settings()).await;
    let served = Served::start(&second.kernel).await;
    served
        .with_token(&secret)
        .get_process(pb::GetProcessRequest { pid: 1 })
        .await
        .unwrap();
    let all = second.kernel.tokens().list(Caller::Admin, true).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].id, kept.id);
    assert!(all[1].revoked_ms.is_some(), "{all:?}");
    let (next, _) = second
        .kernel
        .tokens()
        .create(
            Caller::Admin,
            NewToken {
                name: Some("old".into()),
                scope: Scope::Read,
                expires_in: None,
            },
        )
        .await
        .unwrap();
    assert!(next.id > gone.id, "a revoked token's id is not reused");
    second.kernel.shutdown().await;
    served.stopped().await;
}
