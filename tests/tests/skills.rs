//! Skills end to end: real skill directories (two kernel directories with
//! a name collision, an agent's own directory, a broken skill and one
//! without a description), a `tool_agent` driven by a loopback model that
//! sees the catalogue, activates a skill, reads its files (and is refused
//! a traversal, a symlink out and a file outside its folders), who sees
//! what, and `skills ls` / `skills show` / a reload on the real binary.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{ErrorKind, Pid, Role, SpawnRequest};
use hivekernel_kernel::kernel::Declared;
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted, system_message, tool_results};
use hivekernel_tests::{agent_registry, granting_all, run_task, test_settings};
use serde_json::{Value, json};

/// Writes `<dir>/<name>/SKILL.md` with `text`; answers the skill's directory.
fn skill(dir: &Path, name: &str, text: &str) -> PathBuf {
    let at = dir.join(name);
    std::fs::create_dir_all(&at).unwrap();
    std::fs::write(at.join("SKILL.md"), text).unwrap();
    at
}

/// The directories of one test: `shared` and `team` (the kernel's, in that
/// order), `ops` (an agent's), and a secret outside them all.
struct Skills {
    _root: tempfile::TempDir,
    shared: PathBuf,
    team: PathBuf,
    ops: PathBuf,
}

fn skill_dirs() -> Skills {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().canonicalize().unwrap();
    let (shared, team, ops) = (base.join("shared"), base.join("team"), base.join("ops"));
    skill(
        &shared,
        "deploy",
        "---\nname: deploy\ndescription: Deploy (the old way).\n---\nOld steps.\n",
    );
    skill(
        &shared,
        "triage",
        "---\nname: triage\ndescription: Triage a failing build.\n---\nRead the log first.\n",
    );
    skill(&shared, "broken", "---\nname: [broken\n---\nbody\n");
    skill(&shared, "nodesc", "---\nname: nodesc\n---\nbody\n");
    let deploy = skill(
        &team,
        "deploy",
        "---\nname: deploy\ndescription: >\n  Deploy the service\n  to production.\nlicense: MIT\n\
         metadata:\n  owner: platform\n---\n1. Run the checklist in references/checklist.md.\n\
         2. Ship it with scripts/ship.sh.\n",
    );
    std::fs::create_dir_all(deploy.join("references")).unwrap();
    std::fs::create_dir_all(deploy.join("scripts")).unwrap();
    std::fs::write(deploy.join("references/checklist.md"), "CHECKLIST-42\n").unwrap();
    std::fs::write(deploy.join("scripts/ship.sh"), "#!/bin/sh\necho shipped\n").unwrap();
    std::fs::write(base.join("secret.txt"), "TOP-SECRET\n").unwrap();
    std::os::unix::fs::symlink(base.join("secret.txt"), deploy.join("references/escape.md"))
        .unwrap();
    // A folder that is a link back into the skill: no way around the folders.
    std::os::unix::fs::symlink(".", deploy.join("assets")).unwrap();
    skill(
        &ops,
        "rotate-keys",
        "---\nname: rotate-keys\ndescription: Rotate the signing keys.\n---\nRotate them.\n",
    );
    Skills {
        _root: root,
        shared,
        team,
        ops,
    }
}

fn agent(name: &str, tools: &[&str]) -> SpawnRequest {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.role = Role::Agent;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    request
}

/// A kernel with `shared` and `team` as its skill directories, and two
/// config agents: `ops` (tools `skills`, its own directory `ops`) and
/// `worker` (tool `skill:triage`). Answers the kernel and their PIDs.
async fn kernel(skills: &Skills, llm: &LlmServer) -> (Kernel, Pid, Pid) {
    let mut settings = granting_all(test_settings(), &[Role::Agent]);
    settings.skills = vec![skills.shared.clone(), skills.team.clone()];
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let mut ops = agent("ops", &["skills", "spawn_child"]);
    ops.skills = vec![skills.ops.clone()];
    let worker = agent("worker", &["skill:triage", "spawn_child"]);
    let started = Kernel::builder(settings)
        .runtimes(registry)
        .llm(Arc::new(llm.provider()))
        .agents(vec![Declared::new(ops), Declared::new(worker)])
        .start()
        .await
        .unwrap();
    (started.kernel, started.agents[0], started.agents[1])
}

fn names(kernel: &Kernel, pid: Pid) -> Vec<String> {
    kernel
        .skills()
        .for_caller(Caller::Process(pid))
        .unwrap()
        .iter()
        .map(|entry| entry.skill.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sees_the_catalogue_activates_a_skill_and_reads_only_its_files() {
    let skills = skill_dirs();
    let view = |name: &str| json!({ "name": name }).to_string();
    let read = |path: &str| json!({ "name": "deploy", "path": path }).to_string();
    let llm = LlmServer::start(vec![
        Scripted::tool_calls(&[("c1", "skill_view", &view("deploy"))]),
        Scripted::tool_calls(&[
            ("c2", "skill_read", &read("references/checklist.md")),
            ("c3", "skill_read", &read("references/../../secret.txt")),
            ("c4", "skill_read", &read("references/escape.md")),
            ("c5", "skill_read", &read("SKILL.md")),
            ("c6", "skill_view", &view("nope")),
            ("c7", "skill_read", &read("/etc/passwd")),
            ("c8", "skill_read", &read("assets/SKILL.md")),
        ]),
        Scripted::content("deployed"),
    ])
    .await;
    let (kernel, ops, _) = kernel(&skills, &llm).await;
    let answer = run_task(&kernel, ops, "deploy the service").await.unwrap();
    assert_eq!(answer, "deployed");

    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    // The catalogue: the later kernel directory's deploy, the agent's own
    // skill, no broken skill.
    let first = system_message(&requests[0]);
    assert!(
        first.contains("- deploy: Deploy the service to production."),
        "{first}"
    );
    assert!(
        first.contains("- triage: Triage a failing build."),
        "{first}"
    );
    assert!(
        first.contains("- rotate-keys: Rotate the signing keys."),
        "{first}"
    );
    assert!(!first.contains("the old way"), "{first}");
    assert!(
        !first.contains("broken") && !first.contains("nodesc"),
        "{first}"
    );
    assert!(!first.contains("### Skill: deploy"), "{first}");
    let view_tool = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "skill_view")
        .unwrap();
    assert_eq!(
        view_tool["function"]["parameters"]["properties"]["name"]["enum"],
        json!(["deploy", "rotate-keys", "triage"])
    );

    // Activated: the instructions are in the system prompt from the next call on.
    let viewed = &tool_results(&requests[1])[0];
    assert!(viewed.contains("Skill deploy is active"), "{viewed}");
    assert!(
        viewed.contains("references/checklist.md") && viewed.contains("scripts/ship.sh"),
        "{viewed}"
    );
    assert!(
        !viewed.contains("assets/"),
        "a linked folder is not listed: {viewed}"
    );
    for later in &requests[1..] {
        let system = system_message(later);
        assert!(system.contains("### Skill: deploy"), "{system}");
        assert!(
            system.contains("2. Ship it with scripts/ship.sh."),
            "{system}"
        );
    }

    let results = tool_results(&requests[2]);
    assert_eq!(results[1], "CHECKLIST-42\n");
    assert!(
        results[2].contains("refused") && results[2].contains(".."),
        "traversal: {}",
        results[2]
    );
    assert!(
        results[3].contains("refused") && !results[3].contains("TOP-SECRET"),
        "symlink: {}",
        results[3]
    );
    assert!(
        results[4].contains("not inside references/, assets/, scripts/"),
        "{}",
        results[4]
    );
    assert!(
        results[5].contains("no skill \"nope\" is available"),
        "{}",
        results[5]
    );
    assert!(results[6].contains("refused"), "{}", results[6]);
    assert!(
        results[7].contains("refused") && results[7].contains("not inside"),
        "{}",
        results[7]
    );
    assert!(results.iter().all(|r| !r.contains("TOP-SECRET")));
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_sees_what_its_tool_list_and_its_tree_give_it() {
    let skills = skill_dirs();
    let llm = LlmServer::start(Vec::new()).await;
    let (kernel, ops, worker) = kernel(&skills, &llm).await;
    assert_eq!(names(&kernel, ops), ["deploy", "rotate-keys", "triage"]);
    assert_eq!(names(&kernel, worker), ["triage"]);
    let plain = kernel
        .spawn(Caller::Admin, agent("plain", &[]))
        .await
        .unwrap();
    assert!(names(&kernel, plain).is_empty());

    // A child inherits its parent's directories, narrowed to its own list.
    let child = kernel
        .spawn(Caller::Process(ops), {
            let mut request = agent("ops-child", &["skill:rotate-keys"]);
            request.parent = ops;
            request
        })
        .await
        .unwrap();
    assert_eq!(names(&kernel, child), ["rotate-keys"]);
    // A child never gets more skills than its parent.
    let mut wider = agent("wider", &["skills"]);
    wider.parent = worker;
    let refused = kernel
        .spawn(Caller::Process(worker), wider)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("skills"), "{refused}");

    // The operator's view: every skill, the shadowed one marked, and the
    // skipped ones with their file and field.
    let (listed, problems) = kernel.skills().listing(Caller::Admin).unwrap();
    let rows: Vec<(String, bool, Vec<String>)> = listed
        .iter()
        .map(|l| (l.entry.skill.name.clone(), l.shadowed, l.scope.clone()))
        .collect();
    let kernel_scope = vec!["kernel".to_owned()];
    assert_eq!(
        rows,
        [
            ("deploy".to_owned(), true, kernel_scope.clone()),
            ("deploy".to_owned(), false, kernel_scope.clone()),
            ("rotate-keys".to_owned(), false, vec!["ops".to_owned()]),
            ("triage".to_owned(), false, kernel_scope),
        ]
    );
    let problem = |dir: &str| {
        problems
            .iter()
            .find(|p| p.path.ends_with(format!("{dir}/SKILL.md")))
            .unwrap_or_else(|| panic!("no problem for {dir}: {problems:?}"))
    };
    assert!(problem("broken").skipped);
    assert!(problem("nodesc").skipped);
    assert!(
        problem("nodesc").message.starts_with("description:"),
        "{problems:?}"
    );
    assert!(
        kernel.skills().listing(Caller::Process(ops)).is_err(),
        "a process lists only its own skills"
    );

    let winner = kernel.skills().get(Caller::Admin, "deploy", None).unwrap();
    assert!(winner.skill.dir.starts_with(&skills.team));
    let hidden = kernel
        .skills()
        .get(Caller::Process(worker), "deploy", None)
        .unwrap_err();
    assert_eq!(hidden.kind(), ErrorKind::NotFound);
    assert!(hidden.to_string().contains("\"deploy\""), "{hidden}");
    kernel.shutdown().await;
}

fn config(skills: &Skills) -> Value {
    json!({
        "kernel": { "skills": [skills.shared, skills.team] },
        "agents": [
            { "name": "ops", "role": "agent", "tools": ["skills"], "skills": [skills.ops] }
        ]
    })
}

#[test]
fn skills_ls_show_and_a_reload_on_the_real_binary() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let skills = skill_dirs();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config(&skills).to_string()).unwrap();
    let kernel = Binary::start(&bin, dir.path());
    let log = kernel.log();
    assert!(
        log.contains("nodesc"),
        "a skipped skill is warned about: {log}"
    );

    let table = kernel.cli(&["skills", "ls"]);
    assert!(table.contains("deploy (shadowed)"), "{table}");
    assert!(
        table.contains("rotate-keys") && table.contains("ops"),
        "{table}"
    );
    assert!(table.contains("skipped:"), "{table}");
    let listed = kernel.json(&["skills", "ls", "--json"]);
    assert_eq!(listed["skills"].as_array().unwrap().len(), 4);

    let shown = kernel.cli(&["skills", "show", "deploy"]);
    assert!(
        shown.contains("description: Deploy the service to production."),
        "{shown}"
    );
    assert!(shown.contains("license: MIT"), "{shown}");
    assert!(shown.contains("metadata.owner: platform"), "{shown}");
    assert!(
        shown.contains("2. Ship it with scripts/ship.sh."),
        "{shown}"
    );
    let missing = kernel
        .command(&["skills", "show", "nope"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("no loaded skill is named \"nope\""), "{said}");

    // A new skill on disk is seen after a reload.
    skill(
        &skills.team,
        "postmortem",
        "---\nname: postmortem\ndescription: Write a postmortem.\n---\nBlameless.\n",
    );
    let reload = kernel.cli(&["config", "reload"]);
    assert!(
        reload.contains("SKILLS") && reload.contains("5 loaded"),
        "{reload}"
    );
    let listed = kernel.json(&["skills", "ls", "--json"]);
    assert_eq!(listed["skills"].as_array().unwrap().len(), 5);
}

const RELEASE: &str = "---\nname: release\ndescription: Cut a release of the service.\n---\n\
                       1. Tag the commit.\n2. Run the release pipeline.\n";

/// A kernel over the store in `data` with `shared` and `team` as skill
/// directories and two swarms: `queen-a` (may save skills) and `queen-b`.
async fn saving_kernel(skills: &Skills, llm: &LlmServer, data: &Path) -> (Kernel, Pid, Pid) {
    let mut settings = granting_all(test_settings(), &[Role::Agent]);
    settings.skills = vec![skills.shared.clone(), skills.team.clone()];
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let (store, recovered) = hivekernel_tests::open_store(data).await;
    let started = Kernel::builder(settings)
        .runtimes(registry)
        .llm(Arc::new(llm.provider()))
        .store(store, recovered)
        .agents(vec![
            Declared::new(agent("queen-a", &["skills", "skill_manage", "spawn_child"])),
            Declared::new(agent("queen-b", &["skills", "skill_manage"])),
        ])
        .start()
        .await
        .unwrap();
    (started.kernel, started.agents[0], started.agents[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_an_agent_saves_is_seen_by_its_swarm_and_not_by_another() {
    let skills = skill_dirs();
    let data = tempfile::tempdir().unwrap();
    let manage = |args: Value| args.to_string();
    let invalid = format!(
        "---\nname: Not_This\ndescription: {}\ncolour: red\n---\nSteps.\n",
        "x".repeat(1100)
    );
    let llm = LlmServer::start(vec![
        // queen-a saves the procedure, and is refused a config skill's name
        // and an invalid skill with every problem named.
        Scripted::tool_calls(&[
            (
                "c1",
                "skill_manage",
                &manage(
                    json!({"action": "create", "name": "release", "content": RELEASE,
                               "reason": "worked for v1.2"}),
                ),
            ),
            (
                "c2",
                "skill_manage",
                &manage(json!({"action": "create", "name": "triage",
                               "content": RELEASE.replace("release", "triage")})),
            ),
            (
                "c3",
                "skill_manage",
                &manage(json!({"action": "create", "name": "bad", "content": invalid})),
            ),
        ]),
        Scripted::content("saved"),
        // Its worker sees the skill and activates it.
        Scripted::tool_calls(&[("w1", "skill_view", &json!({"name": "release"}).to_string())]),
        Scripted::content("released"),
        // queen-b, another swarm, does not see it and cannot change it.
        Scripted::tool_calls(&[
            ("b1", "skill_view", &json!({"name": "release"}).to_string()),
            (
                "b2",
                "skill_manage",
                &manage(json!({"action": "delete", "name": "release"})),
            ),
            (
                "b3",
                "skill_manage",
                &manage(json!({"action": "edit", "name": "triage", "old": "a", "new": "b"})),
            ),
        ]),
        Scripted::content("not mine"),
    ])
    .await;
    let (kernel, queen_a, queen_b) = saving_kernel(&skills, &llm, data.path()).await;
    let mut worker = agent("a-worker", &["skills"]);
    worker.parent = queen_a;
    let worker = kernel
        .spawn(Caller::Process(queen_a), worker)
        .await
        .unwrap();

    assert_eq!(
        run_task(&kernel, queen_a, "save the release steps")
            .await
            .unwrap(),
        "saved"
    );
    let requests = llm.requests();
    let results = tool_results(&requests[1]);
    assert!(
        results[0].contains("created skill release: version 1"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("comes from the config") && results[1].contains("triage"),
        "{}",
        results[1]
    );
    for says in ["is not saved", "name:", "description:", "colour"] {
        assert!(results[2].contains(says), "{says}: {}", results[2]);
    }
    // The next model call already lists it, as written by an agent.
    let second = system_message(&requests[1]);
    assert!(
        second.contains(&format!(
            "- release: <agent-written by=\"process {queen_a} (queen-a)\">Cut a release of the \
             service."
        )),
        "{second}"
    );

    // Visible to the saver's subtree, not to the other swarm.
    assert!(names(&kernel, worker).contains(&"release".to_owned()));
    assert!(names(&kernel, queen_a).contains(&"release".to_owned()));
    assert!(!names(&kernel, queen_b).contains(&"release".to_owned()));
    assert_eq!(
        run_task(&kernel, worker, "release it").await.unwrap(),
        "released"
    );
    let requests = llm.requests();
    assert!(tool_results(&requests[3])[0].contains("Skill release is active"));
    assert!(system_message(&requests[3]).contains("2. Run the release pipeline."));

    assert_eq!(
        run_task(&kernel, queen_b, "release it").await.unwrap(),
        "not mine"
    );
    let requests = llm.requests();
    let results = tool_results(&requests[5]);
    assert!(
        results[0].contains("no skill \"release\" is available"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("may change no saved skill called"),
        "{}",
        results[1]
    );
    assert!(
        results[2].contains("comes from the config") && results[2].contains("only skills saved"),
        "{}",
        results[2]
    );

    // The saver edits it; an invalid edit changes nothing.
    let edit = |rewrite| hivekernel_agents::skill::SkillWrite {
        name: "release".into(),
        owner: None,
        change: hivekernel_agents::skill::SkillChange::Edit {
            rewrite,
            visibility: Some(hivekernel_agents::skill::SkillVisibility::Global),
        },
        reason: Some("share it".into()),
    };
    let edited = kernel
        .skills()
        .manage(
            Caller::Process(queen_a),
            edit(hivekernel_agents::skill::Rewrite::Replace {
                old: "2. Run the release pipeline.".into(),
                new: "2. Run the release pipeline.\n3. Announce it.".into(),
            }),
            None,
        )
        .await
        .unwrap();
    assert_eq!(edited.version, 2);
    let refused = kernel
        .skills()
        .manage(
            Caller::Process(queen_a),
            edit(hivekernel_agents::skill::Rewrite::Whole(
                "no frontmatter".into(),
            )),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    // Global now: the other swarm sees it, and may keep a release of its
    // own, which it then sees instead (the nearest owner wins).
    let owner_of = |pid: Pid| {
        let seen = kernel
            .skills()
            .get(Caller::Process(pid), "release", None)
            .unwrap();
        seen.source.saved().unwrap().owner
    };
    assert_eq!(owner_of(queen_b), queen_a);
    let create = |name: &str, visibility| hivekernel_agents::skill::SkillWrite {
        name: name.into(),
        owner: None,
        change: hivekernel_agents::skill::SkillChange::Create {
            content: RELEASE.replace("name: release", &format!("name: {name}")),
            visibility,
        },
        reason: None,
    };
    use hivekernel_agents::skill::SkillVisibility;
    kernel
        .skills()
        .manage(
            Caller::Process(queen_b),
            create("release", SkillVisibility::Private),
            None,
        )
        .await
        .unwrap();
    assert_eq!(owner_of(queen_b), queen_b);
    assert_eq!(owner_of(queen_a), queen_a);
    // A worker's private skill: hidden from its leader, who may still
    // delete it; the other swarm can do neither.
    kernel
        .skills()
        .manage(
            Caller::Process(worker),
            create("scratch", SkillVisibility::Private),
            None,
        )
        .await
        .unwrap();
    assert!(!names(&kernel, queen_a).contains(&"scratch".to_owned()));
    let delete = |name: &str| hivekernel_agents::skill::SkillWrite {
        name: name.into(),
        owner: None,
        change: hivekernel_agents::skill::SkillChange::Delete,
        reason: None,
    };
    let outsider = kernel
        .skills()
        .manage(Caller::Process(queen_b), delete("scratch"), None)
        .await
        .unwrap_err();
    assert_eq!(outsider.kind(), ErrorKind::NotFound, "{outsider}");
    let cleaned = kernel
        .skills()
        .manage(Caller::Process(queen_a), delete("scratch"), None)
        .await
        .unwrap();
    assert_eq!((cleaned.owner, cleaned.by), (worker, queen_a));

    let history = kernel
        .skills()
        .history(Caller::Admin, "release", Some(queen_a), true)
        .await
        .unwrap();
    let rows: Vec<(u64, String, Pid, String)> = history
        .iter()
        .map(|v| {
            (
                v.version,
                v.action.to_string(),
                v.by,
                v.visibility.to_string(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (1, "create".into(), queen_a, "subtree".into()),
            (2, "edit".into(), queen_a, "global".into()),
        ]
    );
    assert_eq!(history[0].reason.as_deref(), Some("worked for v1.2"));
    assert!(
        history[1]
            .content
            .as_deref()
            .unwrap()
            .contains("3. Announce it.")
    );
    let events: Vec<(String, u64)> = kernel
        .subscribe(Some(0))
        .replay
        .iter()
        .filter_map(|event| match &event.kind {
            hivekernel_kernel::events::EventKind::SkillChanged {
                action, version, ..
            } => Some((action.clone(), *version)),
            _ => None,
        })
        .collect();
    assert_eq!(
        events,
        [
            ("create".into(), 1),
            ("edit".into(), 2),
            ("create".into(), 1),
            ("create".into(), 1),
            ("delete".into(), 2)
        ]
    );

    // Kept across a restart.
    kernel.shutdown().await;
    let (kernel, queen_a, _) = saving_kernel(&skills, &llm, data.path()).await;
    let seen = kernel
        .skills()
        .get(Caller::Process(queen_a), "release", None)
        .unwrap();
    assert!(
        seen.skill.body.contains("3. Announce it."),
        "{}",
        seen.skill.body
    );
    assert_eq!(seen.source.saved().map(|s| s.version), Some(2));
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_skill_on_the_real_binary_ls_show_history_rm() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let skills = skill_dirs();
    let save = json!({"action": "create", "name": "release", "content": RELEASE,
                      "reason": "worked for v1.2"});
    let llm = LlmServer::start(vec![
        Scripted::tool_calls(&[("c1", "skill_manage", &save.to_string())]),
        Scripted::content("saved"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0", "skills": [skills.shared, skills.team] },
        "llm": { "provider": "openai", "base_url": llm.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "roles": { "daemon": { "capabilities": ["send_message", "manage_skills"] } },
        "agents": [
            { "name": "keeper", "role": "daemon", "runtime": "tool_agent", "model": "m",
              "system_prompt": "You keep procedures.", "tools": ["skills", "skill_manage"] }
        ]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let kernel = Binary::start(&bin, dir.path());
    assert_eq!(
        kernel
            .cli(&["exec", "keeper", "save the release steps"])
            .trim(),
        "saved"
    );

    let table = kernel.cli(&["skills", "ls"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("release"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("subtree") && row.contains("saved by process") && row.contains("(keeper)"),
        "{row}"
    );
    let shown = kernel.json(&["skills", "show", "release", "--json"]);
    assert_eq!(shown["saved"]["visibility"], "subtree");
    assert_eq!(shown["saved"]["version"], 1);
    assert_eq!(shown["saved"]["owner_name"], "keeper");
    assert!(
        shown["body"]
            .as_str()
            .unwrap()
            .contains("1. Tag the commit.")
    );

    let history = kernel.cli(&["skills", "history", "release"]);
    assert!(
        history.contains("create") && history.contains("worked for v1.2"),
        "{history}"
    );
    // A config skill is not the agents' to change, nor has a history.
    let config_rm = kernel
        .command(&["skills", "rm", "triage"])
        .output()
        .unwrap();
    assert!(!config_rm.status.success());
    let said = String::from_utf8_lossy(&config_rm.stderr);
    assert!(said.contains("comes from the config"), "{said}");

    let removed = kernel.cli(&["skills", "rm", "release", "--reason", "stale"]);
    assert!(removed.contains("deleted skill release"), "{removed}");
    let history = kernel.json(&["skills", "history", "release", "--json"]);
    let rows: Vec<(String, String)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["action"].as_str().unwrap().to_owned(),
                v["by_name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("create".to_owned(), "keeper".to_owned()),
            ("delete".to_owned(), "admin".to_owned())
        ]
    );
    assert!(
        history[0]["content"]
            .as_str()
            .unwrap()
            .contains("Tag the commit")
    );
    let gone = kernel
        .command(&["skills", "show", "release"])
        .output()
        .unwrap();
    assert!(!gone.status.success());
    let events = kernel.cli(&["events", "--type", "skill_changed"]);
    assert_eq!(events.lines().count(), 2, "{events}");
}
