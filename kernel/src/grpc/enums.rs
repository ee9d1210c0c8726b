//! The one mapping between the proto enums and the kernel's own.
//!
//! `*_from_proto` answers `None` for `UNSPECIFIED`; callers pick the default.

use hivekernel_agents::{Priority, ProcessState, RestartPolicy, Role, Strategy, Tier, Visibility};
use hivekernel_proto::v1 as pb;

/// Declares `$to(kernel) -> proto` and `$from(proto) -> Option<kernel>` from one variant list.
macro_rules! mapping {
    ($to:ident, $from:ident, $kernel:ident, $proto:ident, [$($variant:ident),+ $(,)?]) => {
        pub(crate) fn $to(value: $kernel) -> pb::$proto {
            match value {
                $($kernel::$variant => pb::$proto::$variant,)+
            }
        }

        pub(crate) fn $from(value: pb::$proto) -> Option<$kernel> {
            match value {
                $(pb::$proto::$variant => Some($kernel::$variant),)+
                pb::$proto::Unspecified => None,
            }
        }
    };
}

mapping!(
    role_to_proto,
    role_from_proto,
    Role,
    Role,
    [Kernel, Daemon, Agent, Architect, Lead, Worker, Task]
);
mapping!(
    tier_to_proto,
    tier_from_proto,
    Tier,
    CognitiveTier,
    [Strategic, Tactical, Operational]
);
mapping!(
    state_to_proto,
    state_from_proto,
    ProcessState,
    ProcessState,
    [
        Idle, Running, Blocked, Sleeping, Zombie, Dead, Restarting, Waiting
    ]
);
mapping!(
    visibility_to_proto,
    visibility_from_proto,
    Visibility,
    Visibility,
    [Private, User, Subtree, Global]
);
mapping!(
    priority_to_proto,
    priority_from_proto,
    Priority,
    Priority,
    [Critical, High, Normal, Low]
);
mapping!(
    policy_to_proto,
    policy_from_proto,
    RestartPolicy,
    RestartPolicy,
    [Permanent, Transient, Temporary]
);
mapping!(
    strategy_to_proto,
    strategy_from_proto,
    Strategy,
    Strategy,
    [OneForOne, OneForAll, RestForOne]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips() {
        for &role in Role::ALL {
            assert_eq!(role_from_proto(role_to_proto(role)), Some(role));
        }
        for &tier in Tier::ALL {
            assert_eq!(tier_from_proto(tier_to_proto(tier)), Some(tier));
        }
        for &state in ProcessState::ALL {
            assert_eq!(state_from_proto(state_to_proto(state)), Some(state));
        }
        for priority in Priority::ALL {
            assert_eq!(
                priority_from_proto(priority_to_proto(priority)),
                Some(priority)
            );
        }
        for &policy in RestartPolicy::ALL {
            assert_eq!(policy_from_proto(policy_to_proto(policy)), Some(policy));
        }
        for &strategy in Strategy::ALL {
            assert_eq!(
                strategy_from_proto(strategy_to_proto(strategy)),
                Some(strategy)
            );
        }
        assert_eq!(role_from_proto(pb::Role::Unspecified), None);
    }
}
