//! `Attach`, `CompleteTask` and `AckMessages`: the RPCs an external
//! (`exec`) agent needs beyond the rest of the API. See the proto for why they are a
//! server stream plus a unary call rather than one bidi stream.

use hivekernel_agents::{MessageId, Pid, RequestId};
use hivekernel_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::enums;
use super::service::caller;
use super::streams::{Stop, send};
use crate::exec::{Attached, Delivery};
use crate::kernel::Kernel;

/// Deliveries in flight between the forwarder and the client.
const BUFFER: usize = 16;

/// The stream an `Attach` call answers with.
pub(crate) type AttachStream = ReceiverStream<Result<pb::Delivery, Status>>;

/// Opens the caller's attach stream. A kernel-tracked task forwards the
/// deliveries; the stream ends when the process exits, with ABORTED when a
/// newer Attach replaces it, and when the server drains or the kernel stops.
pub(crate) fn attach(
    kernel: &Kernel,
    stop: &Stop,
    request: Request<pb::AttachRequest>,
) -> Result<Response<AttachStream>, Status> {
    let caller = caller(&request)?;
    let pid = match request.get_ref().pid {
        0 => caller.pid(),
        pid => Pid(pid),
    };
    let Attached {
        mut deliveries,
        replaced,
    } = kernel
        .exec()
        .attach(caller, pid, request.get_ref().auto_ack)?;
    let (tx, rx) = mpsc::channel(BUFFER);
    let stop = stop.clone();
    let forward = async move {
        loop {
            let delivery = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tx.closed() => return,
                () = replaced.cancelled() => {
                    let ended = Status::aborted("a newer Attach of this process replaced this stream");
                    send(&tx, Err(ended), &stop).await;
                    return;
                }
                delivery = deliveries.recv() => delivery,
            };
            let Some(delivery) = delivery else { return };
            if !send(&tx, Ok(delivery_to_proto(delivery)), &stop).await {
                return;
            }
        }
    };
    kernel.tracker().spawn(forward);
    Ok(Response::new(ReceiverStream::new(rx)))
}

/// Answers one of the caller's tasks.
pub(crate) fn complete_task(
    kernel: &Kernel,
    request: Request<pb::CompleteTaskRequest>,
) -> Result<Response<pb::CompleteTaskResponse>, Status> {
    let caller = caller(&request)?;
    let req = request.into_inner();
    if req.request_id == 0 {
        return Err(Status::invalid_argument("request_id must be set"));
    }
    let reply = if req.success {
        Ok(req.output)
    } else {
        Err(req.error)
    };
    kernel
        .exec()
        .complete_task(caller, RequestId(req.request_id), reply)?;
    Ok(Response::new(pb::CompleteTaskResponse {}))
}

/// Acknowledges messages of the caller.
pub(crate) fn ack_messages(
    kernel: &Kernel,
    request: Request<pb::AckMessagesRequest>,
) -> Result<Response<pb::AckMessagesResponse>, Status> {
    let caller = caller(&request)?;
    let ids: Vec<MessageId> = request
        .into_inner()
        .message_ids
        .into_iter()
        .map(MessageId)
        .collect();
    let acknowledged = kernel.exec().ack_messages(caller, &ids)?;
    Ok(Response::new(pb::AckMessagesResponse { acknowledged }))
}

fn delivery_to_proto(delivery: Delivery) -> pb::Delivery {
    use pb::delivery::Item;
    let item = match delivery {
        Delivery::Attached { pid, name } => Item::Attached(pb::Attached {
            pid: pid.0,
            name: name.to_string(),
        }),
        Delivery::Task {
            task,
            deadline_unix_ms,
        } => Item::Task(pb::TaskDelivery {
            request_id: task.request_id.0,
            from: task.from.0,
            description: task.description,
            params: task.params.into_iter().collect(),
            deadline_unix_ms,
        }),
        Delivery::Message(message) => Item::Message(pb::MessageDelivery {
            message_id: message.id.0,
            from: message.from.0,
            r#type: message.kind,
            payload: message.payload,
            priority: enums::priority_to_proto(message.priority) as i32,
            request_id: message.request_id.map_or(0, |id| id.0),
            via: message.via.map_or(0, |pid| pid.0),
        }),
    };
    pb::Delivery { item: Some(item) }
}
