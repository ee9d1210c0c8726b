#!/usr/bin/env python3
"""A HiveKernel client in Python: spawn agents, show the process tree, run
tasks, send messages, follow events.

    python client.py demo                    # spawn echo_agent.py, show the tree, run a task, kill it
    python client.py spawn --name py         # spawn echo_agent.py (runtime exec) under PID 1; prints its PID
    python client.py spawn --name e --runtime echo
    python client.py spawn --name sh -- /bin/sh -c 'exec my-agent'
    python client.py tree
    python client.py exec 2 "hello"          # prints the task's output
    python client.py send 2 "note"
    python client.py kill 2
    python client.py wait 2                  # the exit record, as JSON
    python client.py events --since 0        # replay, then follow live events (Ctrl-C stops)

The kernel's address and the admin token come from --addr / --token, then
HIVEKERNEL_ADDR / HIVEKERNEL_TOKEN, then the kernel's data directory
(--data-dir, default .hivekernel: kernel.addr and admin.token). A kernel
that serves TLS (an https:// address, or HIVEKERNEL_TLS_CA set) is trusted
by HIVEKERNEL_TLS_CA, else <data-dir>/tls-ca.pem; HIVEKERNEL_TLS_CERT and
HIVEKERNEL_TLS_KEY give a client certificate for mutual TLS.
"""

import argparse
import json
import pathlib
import sys

import grpc

import hivekernel_sdk

ECHO_AGENT = pathlib.Path(__file__).resolve().parent / "echo_agent.py"


def echo_agent_command():
    """This interpreter (it has grpcio) running echo_agent.py, by absolute paths."""
    return [sys.executable, str(ECHO_AGENT)]


def cmd_spawn(stub, pb, args):
    print(spawn(stub, pb, args))


def spawn(stub, pb, args):
    """Spawns what args describe; returns the new PID."""
    command = args.command
    if command and command[0] == "--":
        command = command[1:]
    runtime = args.runtime or ""
    if not command and runtime in ("", "exec"):
        command = echo_agent_command()
    env = dict(pair.split("=", 1) for pair in args.env)
    reply = stub.Spawn(
        pb.SpawnRequest(
            parent=args.parent, name=args.name, runtime=runtime, command=command, env=env
        )
    )
    return reply.pid


def processes(stub, pb, root=0):
    out = []
    for batch in stub.ListProcesses(pb.ListProcessesRequest(root=root)):
        out.extend(batch.processes)
    return out


def cmd_tree(stub, pb, args):
    procs = processes(stub, pb, args.root)
    children = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    state = lambda p: pb.ProcessState.Name(p.state).removeprefix("PROCESS_STATE_").lower()
    lines = []

    def walk(p, prefix, last, top):
        branch = "" if top else ("└─ " if last else "├─ ")
        extra = f" log={p.log_path}" if p.log_path else ""
        lines.append(f"{prefix}{branch}{p.name} ({p.pid}) {p.runtime} {state(p)}{extra}")
        kids = sorted(children.get(p.pid, []), key=lambda c: c.pid)
        for i, kid in enumerate(kids):
            walk(kid, prefix + ("" if top else ("   " if last else "│  ")), i == len(kids) - 1, False)

    known = {p.pid for p in procs}
    for root in [p for p in procs if p.ppid not in known]:
        walk(root, "", True, True)
    print("\n".join(lines))


def cmd_exec(stub, pb, args):
    reply = stub.ExecuteTask(
        pb.ExecuteTaskRequest(pid=args.pid, description=args.text, timeout_ms=int(args.timeout * 1000))
    )
    if reply.success:
        print(reply.output)
        return 0
    print(f"task failed: {reply.error}", file=sys.stderr)
    return 1


def cmd_send(stub, pb, args):
    print(stub.SendMessage(pb.SendMessageRequest(to=args.pid, payload=args.text)).message_id)


def cmd_kill(stub, pb, args):
    for pid in stub.Kill(pb.KillRequest(pid=args.pid, reason=args.reason)).killed:
        print(pid)


def cmd_wait(stub, pb, args):
    record = stub.WaitChild(pb.WaitChildRequest(pid=args.pid, timeout_ms=int(args.timeout * 1000)))
    print(json.dumps({
        "pid": record.pid, "ppid": record.ppid, "name": record.name,
        "exit_code": record.exit_code, "reason": record.reason,
    }))


def cmd_events(stub, pb, args):
    request = pb.SubscribeEventsRequest(since_seq=args.since or 0, replay=args.since is not None)
    try:
        for event in stub.SubscribeEvents(request):
            print(f"{event.seq} pid={event.pid} {event.type} {event.detail}", flush=True)
    except KeyboardInterrupt:
        pass


def cmd_demo(stub, pb, args):
    args.name, args.parent, args.runtime, args.env, args.command = "py-echo", 1, "", [], []
    pid = spawn(stub, pb, args)
    print(f"spawned echo_agent.py as pid {pid}; the tree:")
    cmd_tree(stub, pb, argparse.Namespace(root=0))
    reply = stub.ExecuteTask(pb.ExecuteTaskRequest(pid=pid, description="hello from client.py", timeout_ms=30000))
    print(f"task result: {reply.output if reply.success else 'failed: ' + reply.error}")
    killed = stub.Kill(pb.KillRequest(pid=pid, reason="demo over")).killed
    print(f"killed {list(killed)}")
    return 0 if reply.success else 1


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", help="kernel host:port [HIVEKERNEL_ADDR, <data-dir>/kernel.addr, 127.0.0.1:50051]")
    p.add_argument("--token", help="bearer token [HIVEKERNEL_TOKEN, <data-dir>/admin.token]")
    p.add_argument("--data-dir", default=".hivekernel", help="the kernel's data directory")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("spawn", help="spawn a process; prints its PID")
    s.add_argument("--name", required=True)
    s.add_argument("--parent", type=int, default=1)
    s.add_argument("--runtime", help="runtime [exec running echo_agent.py when no command is given]")
    s.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("command", nargs=argparse.REMAINDER, help="after --: the OS command of an exec process")
    s.set_defaults(run=cmd_spawn)

    s = sub.add_parser("tree", help="print the process tree")
    s.add_argument("--root", type=int, default=0)
    s.set_defaults(run=cmd_tree)

    s = sub.add_parser("exec", help="run a task and print its output")
    s.add_argument("pid", type=int)
    s.add_argument("text")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds")
    s.set_defaults(run=cmd_exec)

    s = sub.add_parser("send", help="send a message; prints its id")
    s.add_argument("pid", type=int)
    s.add_argument("text")
    s.set_defaults(run=cmd_send)

    s = sub.add_parser("kill", help="kill a process and its subtree")
    s.add_argument("pid", type=int)
    s.add_argument("--reason", default="")
    s.set_defaults(run=cmd_kill)

    s = sub.add_parser("wait", help="collect a child's exit record")
    s.add_argument("pid", type=int)
    s.add_argument("--timeout", type=float, default=30.0, help="seconds")
    s.set_defaults(run=cmd_wait)

    s = sub.add_parser("events", help="follow kernel events")
    s.add_argument("--since", type=int, help="replay retained events after this sequence number first")
    s.set_defaults(run=cmd_events)

    sub.add_parser("demo", help="spawn echo_agent.py, show the tree, run a task, kill it").set_defaults(run=cmd_demo)
    return p


def main():
    args = parser().parse_args()
    pb, _ = hivekernel_sdk.stubs()
    addr = hivekernel_sdk.address(args.addr, args.data_dir)
    stub = hivekernel_sdk.connect(
        addr,
        hivekernel_sdk.token(args.token, args.data_dir),
        hivekernel_sdk.tls_credentials(args.addr, args.data_dir),
    )
    try:
        return args.run(stub, pb, args) or 0
    except grpc.RpcError as err:
        print(f"error: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
