#!/usr/bin/env python3
"""An external HiveKernel agent, written in Python.

The kernel starts it (runtime `exec`) with three variables in its
environment: HIVEKERNEL_ADDR (where the kernel listens), HIVEKERNEL_PID (the
process it is) and HIVEKERNEL_TOKEN (a token that acts as that process only),
plus HIVEKERNEL_TLS_CA (the certificate to trust) when the kernel serves TLS.
It attaches to its mailbox and handles what arrives, in order:

tasks, answered with CompleteTask:
  whoami             -> its own name and PID, read back with GetProcess
  check-permissions  -> JSON: the status code of each call that tries to act
                        as the kernel (PID 1) with this process's token
  exit N             -> exits at once with status N, without answering
  anything else      -> "echo: <text>"
messages: written to stderr (its log file), then acknowledged with
  AckMessages; `exit N` exits with status N. Messages come at least once: one
  seen already (same message_id) is acknowledged and skipped. With
  ECHO_DELAY_MS set, each message takes that long first (a slow consumer).

It exits with status 0 when the kernel ends the stream (its process was
killed or the kernel stopped). SIGTERM ends it at once.
"""

import collections
import json
import os
import sys
import time

import grpc

import hivekernel_sdk


def log(text):
    print(f"echo_agent[{os.environ.get('HIVEKERNEL_PID', '?')}]: {text}", file=sys.stderr, flush=True)


def exit_status(text):
    """N for `exit N`, else None."""
    parts = text.split()
    if len(parts) == 2 and parts[0] == "exit" and parts[1].isdigit():
        return int(parts[1])
    return None


def code_of(call):
    """The status code name a call ends with; OK when it succeeds."""
    try:
        call()
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


def check_permissions(stub, pb, pid):
    """Every way this token might try to act as PID 1; each should be PERMISSION_DENIED."""
    return {
        "spawn_under_pid_1": code_of(
            lambda: stub.Spawn(pb.SpawnRequest(parent=1, name="impostor", runtime="echo"))
        ),
        "send_as_pid_1": code_of(
            lambda: stub.SendMessage(pb.SendMessageRequest(to=pid, payload="hi", **{"from": 1}))
        ),
        "wait_as_parent": code_of(lambda: stub.WaitChild(pb.WaitChildRequest(pid=pid, timeout_ms=1))),
        "kill_pid_1": code_of(lambda: stub.Kill(pb.KillRequest(pid=1))),
        "attach_as_pid_1": code_of(lambda: next(iter(stub.Attach(pb.AttachRequest(pid=1))))),
    }


def answer(stub, pb, pid, task):
    text = task.description
    status = exit_status(text)
    if status is not None:
        log(f"task {task.request_id} asks me to exit with status {status}")
        os._exit(status)
    if text == "whoami":
        info = stub.GetProcess(pb.GetProcessRequest(pid=pid))
        return f"{info.name} (pid {info.pid})"
    if text == "check-permissions":
        return json.dumps(check_permissions(stub, pb, pid), sort_keys=True)
    return f"echo: {text}"


def main():
    try:
        addr = os.environ["HIVEKERNEL_ADDR"]
        pid = int(os.environ["HIVEKERNEL_PID"])
        bearer = os.environ["HIVEKERNEL_TOKEN"]
    except (KeyError, ValueError) as err:
        sys.exit(f"echo_agent: run me through the kernel (runtime exec); missing or bad {err}")
    pb, _ = hivekernel_sdk.stubs()
    # HIVEKERNEL_TLS_CA is set when the kernel serves TLS.
    stub = hivekernel_sdk.connect(addr, bearer, hivekernel_sdk.tls_credentials(addr))
    log(f"starting, os pid {os.getpid()}, kernel at {addr}")
    delay = int(os.environ.get("ECHO_DELAY_MS", "0")) / 1000
    # The latest message ids handled: a redelivery is one of the last few.
    seen = collections.deque(maxlen=1024)
    try:
        for delivery in stub.Attach(pb.AttachRequest()):
            kind = delivery.WhichOneof("item")
            if kind == "attached":
                log(f"attached as {delivery.attached.name} (pid {delivery.attached.pid})")
            elif kind == "task":
                task = delivery.task
                try:
                    output = answer(stub, pb, pid, task)
                    reply = pb.CompleteTaskRequest(request_id=task.request_id, success=True, output=output)
                except Exception as err:  # a failed task, not a failed agent
                    reply = pb.CompleteTaskRequest(request_id=task.request_id, success=False, error=str(err))
                try:
                    stub.CompleteTask(reply)
                except grpc.RpcError as err:
                    # NOT_FOUND: the requester gave up or the deadline passed first.
                    log(f"answer to task {task.request_id} not taken: {err.code().name} {err.details()}")
            elif kind == "message":
                message = delivery.message
                # Delivered at least once: a message seen before (same id) is not handled again.
                if message.message_id in seen:
                    stub.AckMessages(pb.AckMessagesRequest(message_ids=[message.message_id]))
                    continue
                if delay:
                    time.sleep(delay)
                log(f"message {message.message_id} from {getattr(message, 'from')} ({message.type}): {message.payload}")
                status = exit_status(message.payload)
                if status is not None:
                    os._exit(status)
                # Handled: the kernel may forget it. Until then it is kept and sent again.
                stub.AckMessages(pb.AckMessagesRequest(message_ids=[message.message_id]))
                seen.append(message.message_id)
    except grpc.RpcError as err:
        log(f"stream ended: {err.code().name} {err.details()}")
        sys.exit(1)
    log("stream ended: my process has exited")


if __name__ == "__main__":
    main()
