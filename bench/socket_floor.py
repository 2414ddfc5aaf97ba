"""The kernel's floor under SSE streaming on this machine: the CPU one small write to a loopback TCP socket costs.

    python -m bench.socket_floor [--sockets 128] [--rounds 1000] [--tick-ms 5] [--out bench/results]

A streaming server writes at least once per output token per stream (an SSE event), unless it merges tokens
into one event. This measures that write alone, with nothing of a server around it: `--sockets` loopback TCP
connections (TCP_NODELAY, as aiohttp sets), one SSE-sized chunk written to each in turn, `--rounds` times,
`--tick-ms` apart (like one engine step each); a child process reads every connection. The sender's user and
system CPU (getrusage) divided by the writes is the cost of one `send`: a lower bound for any server's CPU per
streamed token on this machine, Python's or not. On loopback the sender's system time includes delivering the
segment to the receiving socket. Writes JSON. The measurement is orchestrator/bench/floor.py's, which
`inferno bench` also runs before each run.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.bench.floor import CHUNK, measure
from orchestrator.bench.report import write

__all__ = ["CHUNK", "main", "measure"]


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
