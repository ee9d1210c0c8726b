//! `events`: replay retained kernel events, or follow the live stream,
//! filtered by process (or subtree) and type.
//!
//! A replay ends with a `replay_done` marker (seq 0); without `--follow`
//! the command stops there. Of the markers only `pruned` and `lagged` are
//! printed: they tell the reader that events were missed.

use std::collections::{HashSet, VecDeque};

use hivekernel_proto::v1::{Event, SubscribeEventsRequest};
use tonic::Streaming;

use super::client::Session;
use super::process::list;
use super::{CliError, EventsArgs, output};

/// The marker that ends a replay.
pub(super) const REPLAY_DONE: &str = "replay_done";
/// Markers that say events were missed: always shown.
pub(super) const MISSED: [&str; 2] = ["pruned", "lagged"];

/// Prints events, one per line, as text or JSON.
pub(super) async fn events(args: EventsArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let trace = match &args.trace {
        Some(text) => Some(
            hivekernel_agents::TraceId::parse(text)
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "--trace: {text:?} is not a trace id (32 hex digits)"
                    ))
                })?
                .to_string(),
        ),
        None => None,
    };
    let mut filter = Filter {
        pids: None,
        subtree: args.subtree,
        types: args.types.iter().map(|t| t.trim().to_owned()).collect(),
        trace,
    };
    if let Some(target) = &args.pid {
        let pid = session.pid(target).await?;
        let pids: HashSet<u64> = if args.subtree {
            list(&mut session, pid)
                .await?
                .iter()
                .map(|p| p.pid)
                .collect()
        } else {
            HashSet::from([pid])
        };
        filter.pids = Some(pids);
    }
    let request = SubscribeEventsRequest {
        since_seq: args.since.unwrap_or(0),
        // --follow alone means live only; otherwise replay what is retained.
        replay: !args.follow || args.since.is_some() || args.tail.is_some(),
    };
    let mut stream = session
        .client
        .subscribe_events(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let render = |event: &Event| {
        if args.json {
            output::line(&output::event_json(event).to_string())
        } else {
            output::line(&output::event_text(event))
        }
    };
    // With --tail, the replay is held back and only its last N printed.
    let mut held: Option<VecDeque<Event>> = args.tail.map(VecDeque::with_capacity);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // If Ctrl-C cannot be caught, the default handler still ends the process.
    let mut catch_ctrl_c = args.follow;
    loop {
        let next = tokio::select! {
            caught = &mut ctrl_c, if catch_ctrl_c => match caught {
                Ok(()) => return Ok(()),
                Err(_) => {
                    catch_ctrl_c = false;
                    continue;
                }
            },
            next = next(&mut stream) => next.map_err(|status| session.error(status))?,
        };
        let Some(event) = next else {
            return Ok(());
        };
        if event.r#type == REPLAY_DONE {
            if let Some(held) = held.take() {
                let text: String = held.iter().map(&render).collect();
                output::print(&text)?;
            }
            if !args.follow {
                return Ok(());
            }
            continue;
        }
        if !filter.keeps(&event) {
            continue;
        }
        match &mut held {
            Some(held) if args.tail.is_some_and(|n| n > 0) => {
                if held.len() == args.tail.unwrap_or(0) {
                    held.pop_front();
                }
                held.push_back(event);
            }
            Some(_) => {}
            None => output::print(&render(&event))?,
        }
    }
}

async fn next(stream: &mut Streaming<Event>) -> Result<Option<Event>, tonic::Status> {
    stream.message().await
}

/// Which events are printed.
struct Filter {
    /// Only these processes' (`None`: every process).
    pids: Option<HashSet<u64>>,
    /// Processes spawned under those in `pids` join it.
    subtree: bool,
    /// Only these types (empty: every type).
    types: Vec<String>,
    /// Only this trace's (lowercase hex).
    trace: Option<String>,
}

impl Filter {
    /// Whether `event` is printed; follows spawns into a watched subtree.
    fn keeps(&mut self, event: &Event) -> bool {
        if MISSED.contains(&event.r#type.as_str()) {
            return true;
        }
        if let Some(pids) = &mut self.pids {
            if self.subtree && event.r#type == "spawned" {
                let ppid = serde_json::from_str::<serde_json::Value>(&event.detail)
                    .ok()
                    .and_then(|detail| detail["ppid"].as_u64());
                if ppid.is_some_and(|ppid| pids.contains(&ppid)) {
                    pids.insert(event.pid);
                }
            }
            if !pids.contains(&event.pid) {
                return false;
            }
        }
        self.trace
            .as_ref()
            .is_none_or(|trace| *trace == event.trace_id)
            && (self.types.is_empty() || self.types.contains(&event.r#type))
    }
}
