//! Artifacts end to end: a durable in-process kernel on a real SQLite file,
//! the visibility rules from every side of the tree, the size limits, the
//! tools as a real process, and the gRPC service on loopback.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use hivekernel_agents::{ArtifactId, ErrorKind, NewArtifact, Pid, Role, Visibility};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::{ArtifactSettings, Caller, Kernel, KernelError};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::durable::{Durable, call_tool};
use hivekernel_tests::served::Served;
use hivekernel_tests::{spawn_probe, test_settings};
use serde_json::{Value, json};
use tonic::Code;

async fn durable(dir: &Path) -> Durable {
    Durable::start(dir, test_settings()).await
}

fn text(name: &str, content: &str, visibility: Visibility) -> NewArtifact {
    NewArtifact {
        visibility: Some(visibility),
        ..NewArtifact::text(name, content)
    }
}

/// parent -> owner -> child, parent -> sibling, and an unrelated branch.
struct Tree {
    parent: Pid,
    owner: Pid,
    child: Pid,
    sibling: Pid,
    unrelated: Pid,
}

async fn tree(kernel: &Kernel) -> Tree {
    let parent = spawn_probe(kernel, Pid::KERNEL, "parent", Role::Lead).await;
    let owner = spawn_probe(kernel, parent, "owner", Role::Lead).await;
    let child = spawn_probe(kernel, owner, "child", Role::Worker).await;
    let sibling = spawn_probe(kernel, parent, "sibling", Role::Worker).await;
    let other = spawn_probe(kernel, Pid::KERNEL, "other", Role::Lead).await;
    let unrelated = spawn_probe(kernel, other, "unrelated", Role::Worker).await;
    Tree {
        parent,
        owner,
        child,
        sibling,
        unrelated,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_visibility_is_seen_by_exactly_its_readers() {
    let dir = tempfile::tempdir().unwrap();
    let hive = durable(dir.path()).await;
    let kernel = &hive.kernel;
    let t = tree(kernel).await;
    let viewers = [
        ("owner", Caller::Process(t.owner)),
        ("parent", Caller::Process(t.parent)),
        ("child", Caller::Process(t.child)),
        ("sibling", Caller::Process(t.sibling)),
        ("unrelated", Caller::Process(t.unrelated)),
        ("admin", Caller::Admin),
    ];
    // Who may read the content; the admin lists every artifact.
    let matrix: [(Visibility, [bool; 6]); 4] = [
        (
            Visibility::Private,
            [true, false, false, false, false, false],
        ),
        (Visibility::User, [true, false, false, false, false, true]),
        (Visibility::Subtree, [true, true, true, false, false, true]),
        (Visibility::Global, [true, true, true, true, true, true]),
    ];
    for (visibility, readers) in matrix {
        let name = format!("{visibility}.txt");
        let info = kernel
            .artifacts()
            .store(
                Caller::Process(t.owner),
                None,
                text(&name, "secret", visibility),
            )
            .await
            .unwrap();
        assert_eq!((info.owner, info.owner_name.as_str()), (t.owner, "owner"));
        assert_eq!(info.content_type, "text/plain");
        for ((who, caller), reads) in viewers.iter().zip(readers) {
            let got = kernel.artifacts().get(*caller, info.id).await;
            match (&got, reads) {
                (Ok(artifact), true) => assert_eq!(artifact.content, b"secret"),
                (Err(KernelError::ArtifactNotFound(id)), false) => assert_eq!(*id, info.id),
                (Err(KernelError::PermissionDenied(why)), false) if *who == "admin" => {
                    assert!(why.contains("private to process"), "{why}");
                }
                _ => panic!("{visibility} read by {who}: {got:?}"),
            }
            let listed = kernel.artifacts().list(*caller, None, None).await.unwrap();
            let lists = listed.iter().any(|a| a.id == info.id);
            assert_eq!(
                lists,
                reads || *who == "admin",
                "{visibility} listed for {who}"
            );
        }
    }
    // Subtree visibility outlives the owner: the line was recorded when it stored.
    let subtree = kernel
        .artifacts()
        .list(Caller::Admin, Some(t.owner), None)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.visibility == Visibility::Subtree)
        .unwrap();
    kernel.kill(Caller::Admin, t.owner, "done").await.unwrap();
    let artifact = kernel
        .artifacts()
        .get(Caller::Process(t.parent), subtree.id)
        .await
        .unwrap();
    assert_eq!(artifact.info.owner_name, "owner");
    let err = kernel
        .artifacts()
        .get(Caller::Process(t.sibling), subtree.id)
        .await
        .unwrap_err();
    assert_eq!(err, KernelError::ArtifactNotFound(subtree.id));
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storing_a_name_again_replaces_it_and_deleting_follows_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let hive = durable(dir.path()).await;
    let kernel = &hive.kernel;
    let t = tree(kernel).await;
    let owner = Caller::Process(t.owner);
    let first = kernel
        .artifacts()
        .store(owner, None, text("plan", "v1", Visibility::Global))
        .await
        .unwrap();
    let second = kernel
        .artifacts()
        .store(
            owner,
            None,
            NewArtifact {
                content_type: Some("application/json".into()),
                ..text("plan", "{\"v\":2}", Visibility::Subtree)
            },
        )
        .await
        .unwrap();
    assert_eq!(second.id, first.id, "same owner, same name: same artifact");
    assert_eq!(second.created_at_unix_ms, first.created_at_unix_ms);
    assert_eq!(second.content_type, "application/json");
    let got = kernel
        .artifacts()
        .get(Caller::Admin, first.id)
        .await
        .unwrap();
    assert_eq!(got.content, b"{\"v\":2}");
    assert_eq!(got.info.visibility, Visibility::Subtree);
    let all = kernel
        .artifacts()
        .list(Caller::Admin, None, None)
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    // Another owner's "plan" is another artifact.
    let theirs = kernel
        .artifacts()
        .store(
            Caller::Process(t.sibling),
            None,
            text("plan", "x", Visibility::Global),
        )
        .await
        .unwrap();
    assert_ne!(theirs.id, first.id);

    // A process stores only as itself; the admin for anyone.
    let err = kernel
        .artifacts()
        .store(owner, Some(t.parent), text("x", "y", Visibility::User))
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::PermissionDenied(_)), "{err}");
    let for_child = kernel
        .artifacts()
        .store(
            Caller::Admin,
            Some(t.child),
            text("note", "n", Visibility::Private),
        )
        .await
        .unwrap();
    assert_eq!(
        (for_child.owner, for_child.owner_name.as_str()),
        (t.child, "child")
    );
    let mine = kernel
        .artifacts()
        .store(Caller::Admin, None, text("ops", "o", Visibility::Private))
        .await
        .unwrap();
    assert_eq!(
        (mine.owner, mine.owner_name.as_str()),
        (Pid::KERNEL, "kernel")
    );
    assert_eq!(
        kernel
            .artifacts()
            .get(Caller::Admin, mine.id)
            .await
            .unwrap()
            .content,
        b"o",
        "the admin owns its own private artifacts"
    );

    // Deleting: not a sibling (it can see it, so it is told why); the
    // owner's ancestors whatever the visibility; the admin anything.
    let err = kernel
        .artifacts()
        .delete(Caller::Process(t.sibling), first.id)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotFound,
        "subtree: the sibling cannot see it"
    );
    let err = kernel
        .artifacts()
        .delete(Caller::Process(t.owner), theirs.id)
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::PermissionDenied(_)), "{err}");
    kernel
        .artifacts()
        .delete(Caller::Process(t.owner), for_child.id)
        .await
        .unwrap();
    kernel
        .artifacts()
        .delete(Caller::Process(t.parent), first.id)
        .await
        .unwrap();
    kernel
        .artifacts()
        .delete(Caller::Admin, theirs.id)
        .await
        .unwrap();
    for id in [first.id, theirs.id, for_child.id] {
        let err = kernel.artifacts().get(Caller::Admin, id).await.unwrap_err();
        assert_eq!(err, KernelError::ArtifactNotFound(id));
    }
    let err = kernel
        .artifacts()
        .delete(Caller::Admin, ArtifactId(987_654))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limits_refuse_a_store_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let settings = KernelSettings {
        artifacts: ArtifactSettings {
            max_bytes: 16,
            max_bytes_per_owner: 40,
        },
        ..test_settings()
    };
    let hive = Durable::start(dir.path(), settings).await;
    let kernel = &hive.kernel;
    let me = Caller::Process(spawn_probe(kernel, Pid::KERNEL, "hoarder", Role::Agent).await);
    let sixteen = "x".repeat(16);

    let err = kernel
        .artifacts()
        .store(me, None, NewArtifact::text("big", "x".repeat(17)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    let message = err.to_string();
    assert!(
        message.contains("kernel.artifacts.max_bytes (16 bytes)") && message.contains("17"),
        "{message}"
    );
    assert!(
        kernel
            .artifacts()
            .list(me, None, None)
            .await
            .unwrap()
            .is_empty()
    );

    kernel
        .artifacts()
        .store(me, None, NewArtifact::text("a", sixteen.clone()))
        .await
        .unwrap();
    kernel
        .artifacts()
        .store(me, None, NewArtifact::text("b", sixteen.clone()))
        .await
        .unwrap();
    let err = kernel
        .artifacts()
        .store(me, None, NewArtifact::text("c", sixteen.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(
        err.to_string()
            .contains("kernel.artifacts.max_bytes_per_owner (40 bytes)"),
        "{err}"
    );
    let names: Vec<String> = kernel
        .artifacts()
        .list(me, None, None)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(!names.contains(&"c".to_owned()));
    // Replacing counts the new size instead of the old one.
    kernel
        .artifacts()
        .store(me, None, NewArtifact::text("b", "y".repeat(8)))
        .await
        .unwrap();
    kernel
        .artifacts()
        .store(me, None, NewArtifact::text("c", "z".repeat(16)))
        .await
        .unwrap();

    // Bad names and types are refused by name.
    for (artifact, needle) in [
        (NewArtifact::text(" ", "x"), "artifact name"),
        (NewArtifact::text("a\u{7}b", "x"), "control characters"),
        (
            NewArtifact {
                content_type: Some("not a type".into()),
                ..NewArtifact::text("t", "x")
            },
            "content type",
        ),
    ] {
        let err = kernel
            .artifacts()
            .store(me, None, artifact)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_kernel_without_a_store_refuses_artifacts_clearly() {
    let (kernel, _) = hivekernel_tests::kernel().await;
    let err = kernel
        .artifacts()
        .store(Caller::Admin, None, NewArtifact::text("a", "b"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    assert!(err.to_string().contains("no store"), "{err}");
    let err = kernel
        .artifacts()
        .list(Caller::Admin, None, None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_store_list_and_read_as_the_calling_process() {
    let dir = tempfile::tempdir().unwrap();
    let hive = durable(dir.path()).await;
    let lead = hive.captured(Pid::KERNEL, "lead", Role::Lead).await;
    let worker = hive.captured(lead.pid, "worker", Role::Worker).await;
    let stranger = hive.captured(Pid::KERNEL, "stranger", Role::Agent).await;

    let out = call_tool(
        &worker,
        "store_artifact",
        json!({"name": "findings.md", "content": "# Findings\nall good", "content_type": "text/markdown", "visibility": "subtree"}),
    )
    .await
    .unwrap();
    let id: u64 = out
        .strip_prefix("stored artifact ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        out.ends_with("(\"findings.md\", 19 bytes, subtree)"),
        "{out}"
    );

    // The lead (an ancestor) lists and reads it; a stranger does neither.
    let listed: Value =
        serde_json::from_str(&call_tool(&lead, "list_artifacts", json!({})).await.unwrap())
            .unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["owner"], worker.pid.0);
    assert_eq!(listed[0]["owner_name"], "worker");
    assert_eq!(listed[0]["visibility"], "subtree");
    assert!(listed[0].get("content").is_none());
    let got: Value = serde_json::from_str(
        &call_tool(&lead, "get_artifact", json!({"id": id}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(got["content"], "# Findings\nall good");
    assert_eq!(got["content_type"], "text/markdown");
    let none = call_tool(&stranger, "list_artifacts", json!({"owner": worker.pid.0}))
        .await
        .unwrap();
    assert_eq!(none, "[]");
    let err = call_tool(&stranger, "get_artifact", json!({"id": id}))
        .await
        .unwrap_err();
    assert_eq!(err.0, format!("artifact {id} not found"));

    // Binary content is described, not shown.
    let binary = hive
        .kernel
        .artifacts()
        .store(
            Caller::Admin,
            Some(lead.pid),
            NewArtifact {
                content_type: Some("image/png".into()),
                visibility: Some(Visibility::Global),
                ..NewArtifact {
                    content: vec![0x89, b'P', b'N', b'G', 0xff],
                    ..NewArtifact::text("logo.png", "")
                }
            },
        )
        .await
        .unwrap();
    let err = call_tool(&stranger, "get_artifact", json!({"id": binary.id.0}))
        .await
        .unwrap_err();
    assert!(err.0.contains("not text"), "{err}");

    for (tool, args, needle) in [
        (
            "store_artifact",
            json!({"name": "x"}),
            "missing field `content`",
        ),
        (
            "store_artifact",
            json!({"name": "x", "content": "y", "visibility": "everyone"}),
            "private, user, subtree, global",
        ),
        (
            "store_artifact",
            json!({"name": "x", "content": 5}),
            "`content`",
        ),
        ("get_artifact", json!({"id": "7"}), "`id`"),
        ("list_artifacts", json!({"owner": -1}), "`owner`"),
    ] {
        let err = call_tool(&worker, tool, args.clone()).await.unwrap_err();
        assert!(
            err.0.starts_with(&format!("invalid arguments for {tool}")) && err.0.contains(needle),
            "{tool} {args}: {err}"
        );
    }
    hive.kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_service_stores_lists_reads_and_deletes_with_proper_codes() {
    let dir = tempfile::tempdir().unwrap();
    let settings = KernelSettings {
        artifacts: ArtifactSettings {
            max_bytes: 6 << 20,
            max_bytes_per_owner: 64 << 20,
        },
        ..test_settings()
    };
    let hive = Durable::start(dir.path(), settings).await;
    let agent = spawn_probe(&hive.kernel, Pid::KERNEL, "agent", Role::Agent).await;
    let served = Served::start(&hive.kernel).await;
    let mut client = served.admin();

    // Larger than tonic's default 4 MiB message limit.
    let big: Vec<u8> = (0..5 << 20).map(|i| (i % 251) as u8).collect();
    let info = client
        .store_artifact(pb::StoreArtifactRequest {
            name: "dump.bin".into(),
            content: big.clone(),
            content_type: "application/octet-stream".into(),
            visibility: pb::Visibility::Global as i32,
            owner: agent.0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.owner, info.owner_name.as_str()), (agent.0, "agent"));
    assert_eq!(info.size, big.len() as u64);
    assert_eq!(info.visibility, pb::Visibility::Global as i32);
    let mine = client
        .store_artifact(pb::StoreArtifactRequest {
            name: "note".into(),
            content: b"hello".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((mine.owner, mine.content_type.as_str()), (1, "text/plain"));
    assert_eq!(mine.visibility, pb::Visibility::User as i32, "the default");

    let got = client
        .get_artifact(pb::GetArtifactRequest { id: info.id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.content, big);
    assert_eq!(got.info.unwrap().name, "dump.bin");

    let listed = client
        .list_artifacts(pb::ListArtifactsRequest { owner: 0, limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .artifacts;
    let ids: Vec<u64> = listed.iter().map(|a| a.id).collect();
    assert_eq!(ids, [mine.id, info.id], "newest first");
    let only = client
        .list_artifacts(pb::ListArtifactsRequest {
            owner: agent.0,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .artifacts;
    assert_eq!(only.len(), 1);

    client
        .delete_artifact(pb::DeleteArtifactRequest { id: info.id })
        .await
        .unwrap();
    let status = client
        .get_artifact(pb::GetArtifactRequest { id: info.id })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains(&format!("artifact {}", info.id)));
    let status = client
        .get_artifact(pb::GetArtifactRequest { id: 0 })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = client
        .store_artifact(pb::StoreArtifactRequest {
            name: "too-big".into(),
            content: vec![0; (6 << 20) + 1],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("kernel.artifacts.max_bytes"));
    let status = client
        .store_artifact(pb::StoreArtifactRequest {
            name: "x".into(),
            visibility: 42,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("visibility"), "{status:?}");
    let status = client
        .store_artifact(pb::StoreArtifactRequest {
            name: "x".into(),
            owner: 9999,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    hive.kernel.shutdown().await;
    served.stopped().await;
}

/// A `SKILL.md` of about `bytes` bytes.
fn skill_text(name: &str, bytes: usize) -> String {
    format!(
        "---\nname: {name}\ndescription: Fill the store.\n---\n{}\n",
        "s".repeat(bytes)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subtree_quota_counts_artifacts_memory_and_skills_alive_or_gone() {
    use hivekernel_agents::skill::{SkillChange, SkillVisibility, SkillWrite};
    use hivekernel_agents::{Capabilities, Capability, NewMemory};
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings();
    settings.storage.max_bytes_per_subtree = 100_000;
    let leads = Capabilities::role_default(Role::Lead).with(Capability::ManageSkills);
    settings.roles.insert(
        Role::Lead,
        hivekernel_kernel::config::RoleSettings {
            capabilities: Some(leads),
            ..Default::default()
        },
    );
    let hive = Durable::start(dir.path(), settings).await;
    let kernel = &hive.kernel;
    let lead = spawn_probe(kernel, Pid::KERNEL, "lead", Role::Lead).await;
    let worker = spawn_probe(kernel, lead, "worker", Role::Worker).await;
    let store = |pid: Pid, name: &'static str, bytes: usize| {
        kernel.artifacts().store(
            Caller::Process(pid),
            None,
            NewArtifact::text(name, "x".repeat(bytes)),
        )
    };
    let quota_refusal = |err: KernelError| {
        let why = err.to_string();
        assert!(
            why.contains(&format!("storage quota of process {lead} (lead)"))
                && why.contains("kernel.storage.max_bytes_per_subtree (100000 bytes)"),
            "{why}"
        );
    };
    // 30 kB of memory (the worker's), 40 kB of skill (its text, kept as the
    // skill and as its newest version), 20 kB of artifact: 90 kB, so 12 kB
    // more of any kind is refused.
    for key in ["a", "b"] {
        let entry = NewMemory {
            text: "m".repeat(15_000),
            key: Some(key.into()),
            tags: Vec::new(),
        };
        kernel
            .memory()
            .store(Caller::Process(worker), entry)
            .await
            .unwrap();
    }
    let create = |name: &str, bytes| SkillWrite {
        name: name.into(),
        owner: None,
        change: SkillChange::Create {
            content: skill_text(name, bytes),
            visibility: SkillVisibility::Subtree,
        },
        reason: None,
    };
    kernel
        .skills()
        .manage(Caller::Process(lead), create("fill", 19_900), None)
        .await
        .unwrap();
    store(worker, "a", 20_000).await.unwrap();
    // Each kind is refused past the quota, naming it.
    let artifact = store(lead, "b", 12_000).await;
    quota_refusal(artifact.unwrap_err());
    let memory = kernel
        .memory()
        .store(
            Caller::Process(lead),
            NewMemory {
                text: "m".repeat(12_000),
                key: None,
                tags: Vec::new(),
            },
        )
        .await;
    quota_refusal(memory.unwrap_err());
    let skill = kernel
        .skills()
        .manage(Caller::Process(lead), create("more", 6_000), None)
        .await;
    quota_refusal(skill.unwrap_err());
    // Replacing an entry with one no larger is always allowed.
    let same = NewMemory {
        text: "n".repeat(15_000),
        key: Some("a".into()),
        tags: Vec::new(),
    };
    kernel
        .memory()
        .store(Caller::Process(worker), same)
        .await
        .unwrap();
    // The worker forgets its memory and exits: its artifact stays and counts.
    for key in ["a", "b"] {
        kernel
            .memory()
            .forget(Caller::Process(worker), key)
            .await
            .unwrap();
    }
    kernel.kill(Caller::Admin, worker, "done").await.unwrap();
    store(lead, "c", 25_000).await.unwrap();
    // 40 kB skill + 20 kB gone worker's artifact + 25 kB: 85 kB, so 20 kB more is refused.
    let over = store(lead, "d", 20_000).await;
    quota_refusal(over.unwrap_err());
    // A deleted skill keeps only its last text in the history, and frees the rest.
    let delete = SkillWrite {
        name: "fill".into(),
        owner: None,
        change: SkillChange::Delete,
        reason: None,
    };
    kernel
        .skills()
        .manage(Caller::Process(lead), delete, None)
        .await
        .unwrap();
    store(lead, "d", 20_000).await.unwrap();
    // Other subtrees are not held by this one's quota.
    let other = spawn_probe(kernel, Pid::KERNEL, "other", Role::Lead).await;
    store(other, "e", 90_000).await.unwrap();
}
