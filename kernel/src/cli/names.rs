//! Proto enums to and from the lowercase names agents use (`daemon`,
//! `tactical`, `idle`), so the CLI speaks the same words as configs.

use hivekernel_agents as agents;
use hivekernel_proto::v1 as pb;

/// The lowercase role name, `unspecified` or `unknown`.
pub(super) fn role(value: i32) -> &'static str {
    let role = match pb::Role::try_from(value) {
        Ok(pb::Role::Kernel) => agents::Role::Kernel,
        Ok(pb::Role::Daemon) => agents::Role::Daemon,
        Ok(pb::Role::Agent) => agents::Role::Agent,
        Ok(pb::Role::Architect) => agents::Role::Architect,
        Ok(pb::Role::Lead) => agents::Role::Lead,
        Ok(pb::Role::Worker) => agents::Role::Worker,
        Ok(pb::Role::Task) => agents::Role::Task,
        Ok(pb::Role::Unspecified) => return "unspecified",
        Err(_) => return "unknown",
    };
    role.as_str()
}

/// The lowercase tier name, `unspecified` or `unknown`.
pub(super) fn tier(value: i32) -> &'static str {
    let tier = match pb::CognitiveTier::try_from(value) {
        Ok(pb::CognitiveTier::Strategic) => agents::Tier::Strategic,
        Ok(pb::CognitiveTier::Tactical) => agents::Tier::Tactical,
        Ok(pb::CognitiveTier::Operational) => agents::Tier::Operational,
        Ok(pb::CognitiveTier::Unspecified) => return "unspecified",
        Err(_) => return "unknown",
    };
    tier.as_str()
}

/// The lowercase state name, `unspecified` or `unknown`.
pub(super) fn state(value: i32) -> &'static str {
    let state = match pb::ProcessState::try_from(value) {
        Ok(pb::ProcessState::Idle) => agents::ProcessState::Idle,
        Ok(pb::ProcessState::Running) => agents::ProcessState::Running,
        Ok(pb::ProcessState::Blocked) => agents::ProcessState::Blocked,
        Ok(pb::ProcessState::Sleeping) => agents::ProcessState::Sleeping,
        Ok(pb::ProcessState::Zombie) => agents::ProcessState::Zombie,
        Ok(pb::ProcessState::Dead) => agents::ProcessState::Dead,
        Ok(pb::ProcessState::Unspecified) => return "unspecified",
        Err(_) => return "unknown",
    };
    state.as_str()
}

/// The proto role for an agents role.
pub(super) fn role_to_proto(role: agents::Role) -> pb::Role {
    match role {
        agents::Role::Kernel => pb::Role::Kernel,
        agents::Role::Daemon => pb::Role::Daemon,
        agents::Role::Agent => pb::Role::Agent,
        agents::Role::Architect => pb::Role::Architect,
        agents::Role::Lead => pb::Role::Lead,
        agents::Role::Worker => pb::Role::Worker,
        agents::Role::Task => pb::Role::Task,
    }
}

/// The proto tier for an agents tier.
pub(super) fn tier_to_proto(tier: agents::Tier) -> pb::CognitiveTier {
    match tier {
        agents::Tier::Strategic => pb::CognitiveTier::Strategic,
        agents::Tier::Tactical => pb::CognitiveTier::Tactical,
        agents::Tier::Operational => pb::CognitiveTier::Operational,
    }
}

/// The proto priority for an agents priority.
pub(super) fn priority_to_proto(priority: agents::Priority) -> pb::Priority {
    match priority {
        agents::Priority::Critical => pb::Priority::Critical,
        agents::Priority::High => pb::Priority::High,
        agents::Priority::Normal => pb::Priority::Normal,
        agents::Priority::Low => pb::Priority::Low,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_proto() {
        for &r in agents::Role::ALL {
            assert_eq!(role(role_to_proto(r) as i32), r.as_str());
        }
        for &t in agents::Tier::ALL {
            assert_eq!(tier(tier_to_proto(t) as i32), t.as_str());
        }
        assert_eq!(state(pb::ProcessState::Zombie as i32), "zombie");
        assert_eq!(role(0), "unspecified");
        assert_eq!(tier(99), "unknown");
    }
}
