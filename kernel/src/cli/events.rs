//! `events`: replay retained kernel events, or follow the live stream,
//! filtered by process (or subtree), type and trace; the kernel filters.
//!
//! A replay ends with a `replay_done` marker (seq 0); without `--follow`
//! the command stops there. Of the markers only `pruned` and `lagged` are
//! printed: they tell the reader that events were missed.

use hivekernel_proto::v1::{Event, SubscribeEventsRequest};
use tonic::Streaming;

use super::client::Session;
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
    let pid = match &args.pid {
        Some(target) => session.pid(target).await?,
        None => 0,
    };
    // The newest 0 of the replay: nothing of it.
    let tail = args.tail.map(|n| n as u64);
    if tail == Some(0) && !args.follow {
        return Ok(());
    }
    // --follow alone means live only; otherwise replay what is retained.
    let replay = tail != Some(0) && (!args.follow || args.since.is_some() || tail.is_some());
    let request = SubscribeEventsRequest {
        // A sequence number asks for a replay on its own.
        since_seq: if replay { args.since.unwrap_or(0) } else { 0 },
        replay,
        pid,
        subtree: args.subtree,
        types: args.types.iter().map(|t| t.trim().to_owned()).collect(),
        trace_id: trace.unwrap_or_default(),
        tail: tail.unwrap_or(0),
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
            if !args.follow {
                return Ok(());
            }
            continue;
        }
        output::print(&render(&event))?;
    }
}

async fn next(stream: &mut Streaming<Event>) -> Result<Option<Event>, tonic::Status> {
    stream.message().await
}
