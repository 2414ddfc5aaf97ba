"""What one small write costs when it comes alone, against the same write back to back: CPU per `send`.

    python -m bench.lone_send [--gap-ms 5] [--sends 2000] [--unix] [--reader select|spin] [--sender sleep|busy]

One connection (loopback TCP with TCP_NODELAY, or with `--unix` a Unix socket pair), a forked child reading it, and
`--sends` writes of an SSE-sized chunk, `--gap-ms` apart (0: back to back). Only the `send` itself is timed, with
the sender's thread CPU clock around each, so neither the gap nor the reader counts. `--reader select`: the child
sleeps in select() until data comes (as an idle client or worker does), so each write wakes it; `spin`: it polls
and never sleeps. `--sender busy`: the sender spins through the gap instead of sleeping.

`bench.socket_floor` writes in bursts of 128, as a worker does per engine step; the HTTP process's few writes per
request (a socket handed to a worker, a channel frame, a response's end) come alone, and on a small VM each costs
several times a write in a burst (docs/benchmarking.md, "What one write costs alone"). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from orchestrator.bench.floor import CHUNK, drain


def _read_all(sock: socket.socket, spin: bool) -> int:
    """In the child: read until the sender closes (asleep in select() as the floor's reader is, or polling); the
    bytes read."""
    if not spin:
        return drain([sock])
    total = 0
    sock.setblocking(False)
    while True:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            continue
        if not data:
            return total
        total += len(data)


def _pair(unix: bool) -> tuple[socket.socket, socket.socket]:
    if unix:
        return socket.socketpair()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sender = socket.create_connection(listener.getsockname())
        reader, _ = listener.accept()
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sender, reader


def measure(sends: int, gap_s: float, unix: bool = False, spin_reader: bool = False, busy_sender: bool = False) -> dict:
    sender, reader = _pair(unix)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        sender.close()
        os.close(read_end)
        os.write(write_end, str(_read_all(reader, spin_reader)).encode())
        os._exit(0)
    reader.close()
    os.close(write_end)
    clock, spent = time.thread_time, 0.0
    for _ in range(sends):
        began = clock()
        sender.send(CHUNK)
        spent += clock() - began
        if busy_sender:
            until = time.perf_counter() + gap_s
            while time.perf_counter() < until:
                pass
        elif gap_s:
            time.sleep(gap_s)
    sender.close()
    with os.fdopen(read_end, "rb") as pipe:
        bytes_read = int(pipe.read() or b"0")
    os.waitpid(child, 0)
    return {"socket": "unix" if unix else "tcp", "reader": "spin" if spin_reader else "select",
            "sender": "busy" if busy_sender else "sleep", "gap_ms": gap_s * 1e3, "sends": sends,
            "chunk_bytes": len(CHUNK), "bytes_read": bytes_read, "us_per_send": round(spent * 1e6 / sends, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lone_send", description=__doc__.splitlines()[0])
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--unix", action="store_true", help="a Unix socket pair instead of loopback TCP")
    parser.add_argument("--reader", choices=("select", "spin"), default="select")
    parser.add_argument("--sender", choices=("sleep", "busy"), default="sleep")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.sends, args.gap_ms / 1e3, args.unix, args.reader == "spin", args.sender == "busy")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
