//! Property test: random spawn / kill / wait sequences keep the tree invariants.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use hivekernel_agents::{Pid, ProcessState, Role};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::{kernel, probe_request};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Spawn under the n-th known PID (modulo).
    Spawn(usize, bool),
    /// Kill the n-th known PID.
    Kill(usize),
    /// Collect the n-th known PID as the admin.
    Wait(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), any::<bool>()).prop_map(|(n, task)| Op::Spawn(n, task)),
        2 => any::<usize>().prop_map(Op::Kill),
        1 => any::<usize>().prop_map(Op::Wait),
    ]
}

async fn check_invariants(kernel: &Kernel) {
    let all = kernel
        .list_processes(Caller::Admin, Pid::KERNEL, None)
        .await
        .unwrap();
    let by_pid: HashMap<Pid, _> = all.iter().map(|p| (p.pid, p)).collect();
    assert_eq!(by_pid.len(), all.len(), "a process is listed twice");
    for p in &all {
        if p.pid == Pid::KERNEL {
            continue;
        }
        let parent = by_pid
            .get(&p.ppid)
            .unwrap_or_else(|| panic!("{} has no parent {} in the table", p.pid, p.ppid));
        assert_ne!(
            parent.state,
            ProcessState::Zombie,
            "{} is under zombie {}",
            p.pid,
            p.ppid
        );
        assert!(p.depth == parent.depth + 1, "depth of {} is off", p.pid);
        assert!(parent.role != Role::Task, "task {} has a child", parent.pid);
    }
    for p in &all {
        let live = all
            .iter()
            .filter(|c| c.ppid == p.pid && c.state != ProcessState::Zombie)
            .count();
        assert_eq!(p.children as usize, live, "live child count of {}", p.pid);
        assert!(
            p.children <= p.limits.max_children,
            "{} over max_children",
            p.pid
        );
    }
    assert_eq!(
        kernel.live_count(),
        all.iter()
            .filter(|p| p.state != ProcessState::Zombie)
            .count()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_spawn_kill_wait_keeps_the_tree_sound(ops in prop::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let (kernel, _) = kernel().await;
            let mut known = vec![Pid::KERNEL];
            let mut ever: HashSet<Pid> = HashSet::from([Pid::KERNEL]);
            for op in ops {
                match op {
                    Op::Spawn(n, task) => {
                        let parent = known[n % known.len()];
                        let role = if task { Role::Task } else { Role::Lead };
                        if let Ok(pid) = kernel.spawn(Caller::Admin, probe_request(parent, "p", role)).await {
                            assert!(ever.insert(pid), "pid {pid} reused");
                            known.push(pid);
                        }
                    }
                    Op::Kill(n) => {
                        let _ = kernel.kill(Caller::Admin, known[n % known.len()], "prop").await;
                    }
                    Op::Wait(n) => {
                        let pid = known[n % known.len()];
                        let _ = kernel.wait_child(Caller::Admin, pid, Some(std::time::Duration::from_millis(1))).await;
                    }
                }
                check_invariants(&kernel).await;
            }
            kernel.shutdown().await;
            assert_eq!(kernel.live_count(), 1);
        });
    }
}
