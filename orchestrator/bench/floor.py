"""The kernel's floor under SSE streaming on this machine: the CPU one small write to a loopback TCP socket costs.

A streaming server writes at least once per output token per stream (an SSE event), unless it merges tokens
into one event. `measure` times that write alone, with nothing of a server around it: `sockets` loopback TCP
connections (TCP_NODELAY, as aiohttp sets), one SSE-sized chunk written to each in turn, `rounds` times,
`tick_s` apart (like one engine step each); a child process reads every connection. The sender's user and
system CPU (getrusage, to the microsecond: clock ticks would round a short run's figure by several percent)
divided by the writes is the cost of one `send`: a lower bound for any server's CPU per streamed token on this
machine, Python's or not. On loopback the sender's system time includes delivering the segment to the
receiving socket. A write costs less the more come together (the kernel's path stays warm), so a server is set
against writes in the bursts its engines can make: `inferno bench` measures with as many sockets as one engine
step writes to at its highest level (the concurrency, or the busiest model's share of it).

`inferno bench` measures it in a process of its own (`python -m orchestrator.bench.floor`, which prints the
result as one JSON line: `measure` forks, which a process running an event loop should not) before it starts
the server, and sets every row's server CPU against it; `python -m bench.socket_floor` is the standalone tool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import selectors
import socket
import sys
import time
from asyncio.subprocess import PIPE

CHUNK = (b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764000000,'
         b'"model":"llama3.1-8b-instruct-sim","choices":[{"index":0,"delta":{"content":" word"},'
         b'"finish_reason":null}]}\n\n')
SOCKETS, TICK_S = 128, 0.005


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


class LoopbackReader:
    """`sockets` loopback TCP connections (TCP_NODELAY, as aiohttp sets) whose far ends a forked child reads
    (`drain`): `servers` are the ends to write to, and `close` closes them and returns the bytes the child read."""

    def __init__(self, sockets: int):
        listener = socket.create_server(("127.0.0.1", 0), backlog=sockets)
        clients, self.servers = [], []
        for _ in range(sockets):
            clients.append(socket.create_connection(listener.getsockname()))
            server, _ = listener.accept()
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.servers.append(server)
        listener.close()
        self._pipe, write_end = os.pipe()
        self._child = os.fork()
        if self._child == 0:
            os.close(self._pipe)
            for server in self.servers:
                server.close()
            os.write(write_end, str(drain(clients)).encode())
            os._exit(0)
        os.close(write_end)
        for client in clients:
            client.close()

    def close(self) -> int:
        for server in self.servers:
            server.close()
        with os.fdopen(self._pipe, "rb") as pipe:
            bytes_read = int(pipe.read() or b"0")  # what the child got, once every connection has closed
        os.waitpid(self._child, 0)
        return bytes_read


def measure(sockets: int, rounds: int, tick_s: float) -> dict:
    reader = LoopbackReader(sockets)
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(rounds):
        for server in reader.servers:
            server.send(CHUNK)
        time.sleep(tick_s)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
    bytes_read = reader.close()
    writes = sockets * rounds
    user_us = (after.ru_utime - before.ru_utime) * 1e6 / writes
    system_us = (after.ru_stime - before.ru_stime) * 1e6 / writes
    return {"sockets": sockets, "rounds": rounds, "tick_ms": tick_s * 1e3, "writes": writes, "chunk_bytes": len(CHUNK),
            "bytes_read": bytes_read, "wall_s": round(wall, 2), "user_us_per_write": round(user_us, 2),
            "system_us_per_write": round(system_us, 2), "us_per_write": round(user_us + system_us, 2)}


async def measure_apart(rounds: int, sockets: int) -> dict:
    """`measure` (TICK_S apart) run in a child process; RuntimeError if it fails."""
    command = (sys.executable, "-m", "orchestrator.bench.floor", "--rounds", str(rounds), "--sockets", str(sockets))
    child = await asyncio.create_subprocess_exec(*command, stdout=PIPE, stderr=PIPE)
    out, err = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the floor measurement failed: {err.decode(errors='replace')[-300:]}")
    return json.loads(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.bench.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=SOCKETS)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--tick-ms", type=float, default=TICK_S * 1e3)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.sockets, args.rounds, args.tick_ms / 1e3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
