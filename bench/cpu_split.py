"""User and system CPU per generated token of a running server, by process and thread, over a window of its load.

`inferno bench` reports each process's CPU per token (user and system together). To tell the Python around a write
from the kernel's write itself, this samples `/proc/PID/task/*/stat` (utime and stime apart) of the server and its
workers twice, `--window-s` apart, together with the tokens the server counted (`inferno_generation_tokens_total`,
all models) from its /metrics, and prints µs per token of each. Run it while a load is in its steady middle:

    inferno serve ...  &                            # the server, its pid in PID
    inferno bench --url URL --concurrency 128 --requests 2048 --isl 128 --osl 128 ... &
    sleep 8; python -m bench.cpu_split --url URL --pid PID --window-s 10

The token counter moves when a request ends, so the window should hold many requests' ends (a few seconds of a
128-stream load does). Compare with `python -m orchestrator.bench.floor`, which prints a write's user and system
time the same way. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import psutil

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
COUNTER = "inferno_generation_tokens_total"


def user_system_ticks(stat_text: str) -> tuple[str, int, int]:
    """(comm, utime, stime) from a /proc stat file's text; the comm may hold spaces and parentheses."""
    open_paren, close_paren = stat_text.index("("), stat_text.rindex(")")
    fields = stat_text[close_paren + 2 :].split()
    return stat_text[open_paren + 1 : close_paren], int(fields[11]), int(fields[12])


def tokens_counted(metrics_text: str) -> float:
    """The server's generated tokens so far, every model's series summed."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(COUNTER + "{") or line.startswith(COUNTER + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sample(root_pid: int) -> dict[tuple[int, str], tuple[int, int]]:
    """(pid, "process" or the thread's comm) -> (utime, stime) ticks, for the root and every descendant. Threads of
    one name in a process are summed; "process" is the whole process, its exited threads included."""
    out: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    pids = [root_pid, *(child.pid for child in psutil.Process(root_pid).children(recursive=True))]
    for pid in pids:
        try:
            _, user, system = user_system_ticks(Path(f"/proc/{pid}/stat").read_text())
            out[(pid, "process")] = [user, system]
            for task in Path(f"/proc/{pid}/task").iterdir():
                name, user, system = user_system_ticks((task / "stat").read_text())
                out[(pid, name)][0] += user
                out[(pid, name)][1] += system
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended while we read
    return {key: (user, system) for key, (user, system) in out.items()}


def split(before: dict, after: dict, tokens: float) -> list[dict]:
    """Each (pid, thread) seen in both samples: its user and system µs per token in between, busiest first."""
    rows = []
    for key in before.keys() & after.keys():
        user = (after[key][0] - before[key][0]) / TICKS_PER_S
        system = (after[key][1] - before[key][1]) / TICKS_PER_S
        rows.append({"pid": key[0], "thread": key[1], "user_s": round(user, 2), "system_s": round(system, 2),
                     "user_us_per_token": round(user / tokens * 1e6, 2) if tokens else None,
                     "system_us_per_token": round(system / tokens * 1e6, 2) if tokens else None})
    return sorted(rows, key=lambda row: (row["pid"], row["thread"] != "process", -row["user_s"] - row["system_s"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's base URL (its /metrics is read)")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id (its workers are found)")
    parser.add_argument("--window-s", type=float, default=10.0)
    args = parser.parse_args()

    def counted() -> float:
        with urllib.request.urlopen(args.url.rstrip("/") + "/metrics", timeout=10) as answer:
            return tokens_counted(answer.read().decode())

    tokens_before, before = counted(), sample(args.pid)
    time.sleep(args.window_s)
    tokens_after, after = counted(), sample(args.pid)
    tokens = tokens_after - tokens_before
    if tokens <= 0:
        print("no tokens were counted in the window: run it while a load is going", file=sys.stderr)
        return 1
    print(json.dumps({"window_s": args.window_s, "tokens": tokens, "rows": split(before, after, tokens)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
