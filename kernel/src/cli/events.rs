//! `events`: replay retained kernel events, or follow the live stream.
//!
//! A replay ends with a `replay_done` marker (seq 0); without `--follow`
//! the command stops there. Of the markers only `pruned` and `lagged` are
//! printed: they tell the reader that events were missed.

use hivekernel_proto::v1::{Event, SubscribeEventsRequest};
use tonic::Streaming;

use super::client::Session;
use super::{CliError, EventsArgs, output};

/// The marker that ends a replay.
const REPLAY_DONE: &str = "replay_done";

/// Prints events, one per line, as text or JSON.
pub(super) async fn events(args: EventsArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let request = SubscribeEventsRequest {
        since_seq: args.since.unwrap_or(0),
        // --follow alone means live only; otherwise replay what is retained.
        replay: !args.follow || args.since.is_some(),
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
    if args.follow {
        follow(&session, &mut stream, render).await
    } else {
        loop {
            match stream
                .message()
                .await
                .map_err(|status| session.error(status))?
            {
                Some(event) if event.r#type == REPLAY_DONE => return Ok(()),
                Some(event) => output::print(&render(&event))?,
                None => return Ok(()),
            }
        }
    }
}

/// Prints events until the stream ends or Ctrl-C.
async fn follow(
    session: &Session,
    stream: &mut Streaming<Event>,
    render: impl Fn(&Event) -> String,
) -> Result<(), CliError> {
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // If Ctrl-C cannot be caught, the default handler still ends the process.
    let mut catch_ctrl_c = true;
    loop {
        tokio::select! {
            caught = &mut ctrl_c, if catch_ctrl_c => match caught {
                Ok(()) => return Ok(()),
                Err(_) => catch_ctrl_c = false,
            },
            next = stream.message() => match next.map_err(|status| session.error(status))? {
                Some(event) if event.r#type == REPLAY_DONE => {}
                Some(event) => output::print(&render(&event))?,
                None => return Ok(()),
            },
        }
    }
}
