//! `ps`: the process table, filtered, as a table, a tree or JSON; `--watch`
//! redraws it as events arrive.

use std::time::Duration;

use hivekernel_agents::text::glob_matches as matches_glob;
use hivekernel_proto::v1::{ProcessInfo, SubscribeEventsRequest};
use serde_json::Value;

use super::client::Session;
use super::process::list;
use super::{CliError, PsArgs, PsFilter, human, names, output};

/// Events closer together than this are one redraw.
const WATCH_SETTLE: Duration = Duration::from_millis(200);

/// Lists the tree under `--root` (default PID 1), filtered.
pub(super) async fn ps(args: PsArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let root = session.pid_or_zero(args.root.as_ref()).await?;
    if !args.watch {
        let procs = list(&mut session, root).await?;
        return output::print(&render(&args, &procs));
    }
    let mut events = session
        .client
        .subscribe_events(SubscribeEventsRequest {
            since_seq: 0,
            replay: false,
            ..Default::default()
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let procs = list(&mut session, root).await?;
        // Clear the screen, then the table and when it was drawn.
        let text = format!(
            "{}\n{} (Ctrl-C to stop)\n",
            render(&args, &procs),
            output::rfc3339_utc(human::now_ms())
        );
        output::print_raw("\x1b[H\x1b[2J")?;
        output::print(&text)?;
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            next = events.message() => {
                if next.map_err(|status| session.error(status))?.is_none() {
                    return Ok(());
                }
            }
        }
        // Let a burst finish, then draw once.
        let settle = tokio::time::sleep(WATCH_SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                _ = &mut settle => break,
                next = events.message() => {
                    if next.map_err(|status| session.error(status))?.is_none() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The processes `args` keeps, in the form it asks for.
fn render(args: &PsArgs, procs: &[ProcessInfo]) -> String {
    let kept: Vec<ProcessInfo> = procs
        .iter()
        .filter(|p| keeps(&args.filter, p))
        .cloned()
        .collect();
    if args.json {
        let all = kept.iter().map(output::process_json).collect();
        format!("{:#}\n", Value::Array(all))
    } else if args.tree {
        output::tree(&kept)
    } else {
        output::table(&kept, human::now_ms())
    }
}

/// Whether `p` passes every filter of `args`.
pub(super) fn keeps(args: &PsFilter, p: &ProcessInfo) -> bool {
    let state = names::state(p.state);
    let zombie = state == "zombie";
    let states_ok = if args.state.is_empty() {
        args.all || !zombie
    } else {
        args.state.iter().any(|s| s.as_str() == state)
    };
    states_ok
        && (args.role.is_empty() || args.role.iter().any(|r| r.as_str() == names::role(p.role)))
        && args
            .name
            .as_deref()
            .is_none_or(|glob| matches_glob(glob, &p.name))
        && args
            .labels
            .iter()
            .all(|(key, value)| p.metadata.get(key) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_a_shell() {
        for (glob, text, expected) in [
            ("queen", "queen", true),
            ("queen", "queen-w1", false),
            ("queen-*", "queen-w1", true),
            ("*-w?", "queen-w1", true),
            ("*-w?", "queen-w12", false),
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("?", "é", true),
        ] {
            assert_eq!(matches_glob(glob, text), expected, "{glob} {text}");
        }
    }
}
