"""The kernel's floor under SSE streaming on this machine: the CPU one small write to a loopback TCP socket costs.

    python -m bench.socket_floor [--sockets 128] [--rounds 1000] [--tick-ms 5] [--out bench/results]

A streaming server writes at least once per output token per stream (an SSE event), unless it merges tokens
into one event. This measures that write alone, with nothing of a server around it: `--sockets` loopback TCP
connections (TCP_NODELAY, as aiohttp sets), one SSE-sized chunk written to each in turn, `--rounds` times,
`--tick-ms` apart (like one engine step each); a child process reads every connection. The sender's user and
system CPU (os.times) divided by the writes is the cost of one `send`: a lower bound for any server's CPU per
streamed token on this machine, Python's or not. On loopback the sender's system time includes delivering the
segment to the receiving socket. Writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import selectors
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.bench.report import write

CHUNK = (b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764000000,'
         b'"model":"llama3.1-8b-instruct-sim","choices":[{"index":0,"delta":{"content":" word"},'
         b'"finish_reason":null}]}\n\n')


def drain(clients: list[socket.socket]) -> int:
    """Read every connection until all are closed (in the child process); returns the bytes read."""
    selector = selectors.DefaultSelector()
    for client in clients:
        selector.register(client, selectors.EVENT_READ)
    total = 0
    while selector.get_map():
        for key, _ in selector.select(5.0):
            data = key.fileobj.recv(1 << 16)
            total += len(data)
            if not data:
                selector.unregister(key.fileobj)
    return total


def measure(sockets: int, rounds: int, tick_s: float) -> dict:
    listener = socket.create_server(("127.0.0.1", 0), backlog=sockets)
    port = listener.getsockname()[1]
    clients, servers = [], []
    for _ in range(sockets):
        clients.append(socket.create_connection(("127.0.0.1", port)))
        server, _ = listener.accept()
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        servers.append(server)
    listener.close()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        for server in servers:
            server.close()
        os.write(write_end, str(drain(clients)).encode())
        os._exit(0)
    os.close(write_end)
    for client in clients:
        client.close()
    before, started = os.times(), time.perf_counter()
    for _ in range(rounds):
        for server in servers:
            server.send(CHUNK)
        time.sleep(tick_s)
    after, wall = os.times(), time.perf_counter() - started
    for server in servers:
        server.close()
    with os.fdopen(read_end, "rb") as reader:
        bytes_read = int(reader.read() or b"0")  # what the reader got, once every connection has closed
    os.waitpid(child, 0)
    writes = sockets * rounds
    user_us = (after.user - before.user) * 1e6 / writes
    system_us = (after.system - before.system) * 1e6 / writes
    return {"sockets": sockets, "rounds": rounds, "tick_ms": tick_s * 1e3, "writes": writes,
            "chunk_bytes": len(CHUNK), "bytes_read": bytes_read, "wall_s": round(wall, 2), "user_us_per_write": round(user_us, 2),
            "system_us_per_write": round(system_us, 2), "us_per_write": round(user_us + system_us, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.socket_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    result = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        **measure(args.sockets, args.rounds, args.tick_ms / 1e3),
    }
    print(f"{result['writes']} writes of {result['chunk_bytes']} bytes to {args.sockets} loopback sockets: "
          f"{result['user_us_per_write']} µs user + {result['system_us_per_write']} µs system = "
          f"{result['us_per_write']} µs of CPU per write")
    print(f"wrote {write(result, args.out, prefix='socket-floor')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
