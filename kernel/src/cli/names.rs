//! Proto enums to and from the lowercase names agents use (`daemon`,
//! `tactical`, `idle`), so the CLI speaks the same words as configs.

use hivekernel_proto::v1 as pb;

use crate::grpc::enums::{
    policy_from_proto, role_from_proto, state_from_proto, strategy_from_proto, tier_from_proto,
    visibility_from_proto,
};
pub(super) use crate::grpc::enums::{
    policy_to_proto, priority_to_proto, role_to_proto, strategy_to_proto, tier_to_proto,
    visibility_to_proto,
};

/// The lowercase name of a proto enum value: `unspecified` or `unknown` when it has none.
fn name<P: TryFrom<i32>, K>(
    value: i32,
    from_proto: fn(P) -> Option<K>,
    as_str: fn(K) -> &'static str,
) -> &'static str {
    match P::try_from(value) {
        Ok(proto) => from_proto(proto).map_or("unspecified", as_str),
        Err(_) => "unknown",
    }
}

/// The lowercase role name.
pub(super) fn role(value: i32) -> &'static str {
    name::<pb::Role, _>(value, role_from_proto, |r| r.as_str())
}

/// The lowercase tier name.
pub(super) fn tier(value: i32) -> &'static str {
    name::<pb::CognitiveTier, _>(value, tier_from_proto, |t| t.as_str())
}

/// The lowercase state name.
pub(super) fn state(value: i32) -> &'static str {
    name::<pb::ProcessState, _>(value, state_from_proto, |s| s.as_str())
}

/// The lowercase restart policy name.
pub(super) fn policy(value: i32) -> &'static str {
    name::<pb::RestartPolicy, _>(value, policy_from_proto, |p| p.as_str())
}

/// The lowercase supervision strategy name.
pub(super) fn strategy(value: i32) -> &'static str {
    name::<pb::Strategy, _>(value, strategy_from_proto, |s| s.as_str())
}

/// The lowercase artifact visibility name.
pub(super) fn visibility(value: i32) -> &'static str {
    name::<pb::Visibility, _>(value, visibility_from_proto, |v| v.as_str())
}

#[cfg(test)]
mod tests {
    use hivekernel_agents as agents;

    use super::*;

    #[test]
    fn names_round_trip_through_proto() {
        for &r in agents::Role::ALL {
            assert_eq!(role(role_to_proto(r) as i32), r.as_str());
        }
        for &t in agents::Tier::ALL {
            assert_eq!(tier(tier_to_proto(t) as i32), t.as_str());
        }
        for &v in agents::Visibility::ALL {
            assert_eq!(visibility(visibility_to_proto(v) as i32), v.as_str());
        }
        assert_eq!(state(pb::ProcessState::Zombie as i32), "zombie");
        assert_eq!(role(0), "unspecified");
        assert_eq!(tier(99), "unknown");
    }
}
