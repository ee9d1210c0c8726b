//! The model a process asks for its child: once any name went through, to
//! the provider, the prices and the metrics' `model` label. Now a process
//! gives a child a model the config names, or one on its own line, unless
//! its role has `any_model`; the operator may give any.

use hivekernel_agents::{Capabilities, Capability, ErrorKind, Pid, Role};
use hivekernel_kernel::Caller;
use hivekernel_kernel::config::RoleSettings;
use hivekernel_tests::{kernel_with, probe_request, test_settings};

#[tokio::test]
async fn a_process_gives_its_children_only_models_the_config_names() {
    let mut settings = test_settings();
    settings
        .models
        .models
        .insert("mini".into(), "gpt-4o-mini".into());
    settings.models.configured.insert("planner".into());
    let free = Capabilities::role_default(Role::Architect).with(Capability::AnyModel);
    settings.roles.insert(
        Role::Architect,
        RoleSettings {
            capabilities: Some(free),
            ..RoleSettings::default()
        },
    );
    let (kernel, _journal) = kernel_with(settings).await;
    let child = |parent, name: &str, model: &str| {
        let mut request = probe_request(parent, name, Role::Lead);
        request.model = model.into();
        request
    };
    // The operator chooses freely; its lead runs a model the config does not name.
    let lead = kernel
        .spawn(Caller::Admin, child(Pid::KERNEL, "lead", "own-model"))
        .await
        .unwrap();

    let before = kernel.live_count();
    let made_up = kernel
        .spawn(
            Caller::Process(lead),
            child(lead, "w1", "made-up\u{1b}[31m"),
        )
        .await
        .unwrap_err();
    assert_eq!(made_up.kind(), ErrorKind::PermissionDenied, "{made_up}");
    let why = made_up.to_string();
    for says in ["made-up", "(mini, planner)", "any_model"] {
        assert!(why.contains(says), "{says:?} not in {why}");
    }
    assert!(!why.contains('\u{1b}'), "the name is shown escaped: {why}");
    assert_eq!(
        kernel.live_count(),
        before,
        "a refused spawn made a process"
    );

    // Configured names, the caller's own model and an ancestor's are fine.
    let worker = kernel
        .spawn(Caller::Process(lead), child(lead, "w2", "mini"))
        .await
        .unwrap();
    kernel
        .spawn(Caller::Process(lead), child(lead, "w3", "planner"))
        .await
        .unwrap();
    kernel
        .spawn(Caller::Process(worker), child(worker, "w4", "own-model"))
        .await
        .unwrap();
    // A role with any_model names what it likes.
    let architect = kernel
        .spawn(Caller::Admin, {
            let mut request = child(Pid::KERNEL, "architect", "mini");
            request.role = Role::Architect;
            request
        })
        .await
        .unwrap();
    kernel
        .spawn(
            Caller::Process(architect),
            child(architect, "w5", "gpt-5-experimental"),
        )
        .await
        .unwrap();
}
