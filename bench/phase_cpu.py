"""Where a request's CPU goes, phase by phase, in the HTTP process and its workers: thread CPU per request.

`inferno bench` and `bench.cpu_split` say how much CPU each process spends per token; profilers say where, but
cProfile inflates call-heavy code several times and py-spy samples too few short requests. This counts the
main thread's own CPU time (`time.thread_time`) inside each of a fixed set of functions of the request's path
(PHASES), for as long as a window is open, and prints it per request: what each phase really costs, inclusive
of what it calls, with nothing sampled. An async function is timed only while it runs (each resumption), not
while it waits.

Start the server with this module's hook on its path (its workers inherit it), put a steady load on it, then
open a window in the middle of the load:

    INFERNO_PHASE_DIR=/tmp/phase PYTHONPATH=bench/phase_site inferno serve --engines-dir DIR &   # pid in PID
    inferno bench --url URL --concurrency 128 --requests 3072 --isl 128 --osl 128 &
    sleep 8; python -m bench.phase_cpu --pid PID --window-s 12 --dir /tmp/phase [--osl 128] [--out FILE.json]

Each wrapped call costs two clock reads (~1 µs on a VM): phases are a little dearer than without the hook, the
server a few percent slower. `requests` is the count of `RequestHandler._handle_request` (HTTP) and
`Worker._submit` (worker) calls in the window; "rest of the thread" is the main thread's CPU outside every
top-level phase (the event loop, reads, timers). Linux only.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

# (process role, module, function or Class.method, top level: its time is not inside another phase's)
PHASES = [
    ("http", "aiohttp.web_protocol", "RequestHandler._handle_request", True),
    ("http", "aiohttp.web_protocol", "RequestHandler.data_received", True),
    ("http", "orchestrator.supervisor.client", "WorkerClient._dispatch", True),
    ("http", "orchestrator.ipc.channel", "Channel._write_gathered", True),
    ("http", "aiohttp.web_app", "Application._handle", False),
    ("http", "orchestrator.api.app", "completions", False),
    ("http", "orchestrator.api.app", "chat_completions", False),
    ("http", "orchestrator.api.generation", "serve_generation", False),
    ("http", "orchestrator.api.preparation", "prepare_generation", False),
    ("http", "orchestrator.api.body", "read_json", False),
    ("http", "orchestrator.api.http", "validate", False),
    ("http", "orchestrator.api.wire", "_GenerationRequest.generation", False),
    ("http", "orchestrator.text.pieces", "PieceCache.encode", False),
    ("http", "orchestrator.text.prompt", "PromptEncoder.encode_chat", False),
    ("http", "orchestrator.api.engine_requests", "inference_request", False),
    ("http", "orchestrator.scheduler.admission", "AdmissionControl.acquire", False),
    ("http", "orchestrator.scheduler.admission", "AdmissionControl.release", False),
    ("http", "orchestrator.api.generation", "_EventStream.offer", False),
    ("http", "orchestrator.api.sse", "prepare_event_stream", False),
    ("http", "orchestrator.supervisor.client", "WorkerClient.submit", False),
    ("http", "orchestrator.ipc.handoff", "Handoff.give", False),
    ("http", "orchestrator.ipc.channel", "encode_frame", False),
    ("http", "orchestrator.api.generation", "_EventStream.open", False),
    ("http", "orchestrator.api.stall", "watch_stalls", False),
    ("http", "orchestrator.api.generation", "_EventStream.handle", False),
    ("http", "orchestrator.api.sse", "SseWriter.finish", False),
    ("http", "orchestrator.metrics.request_metrics", "RequestMetrics.observe", False),
    ("http", "orchestrator.api.accounting", "Accounting.settle", False),
    ("worker", "orchestrator.worker.main", "Worker.step", True),
    ("worker", "orchestrator.worker.main", "Worker._handle", True),
    ("worker", "orchestrator.ipc.messages", "decode_to_worker", False),
    ("worker", "orchestrator.worker.main", "Worker._submit", False),
    ("worker", "orchestrator.ipc.handoff", "Handoff.take", False),
    ("worker", "orchestrator.engine.request", "check_request", False),
    ("worker", "orchestrator.worker.direct", "DirectStream.pass_on", False),
]
REQUESTS = {"http": "RequestHandler._handle_request", "worker": "Worker._submit"}
START, STOP = signal.SIGUSR1, signal.SIGUSR2


class _Window:
    """The counts and CPU seconds per phase while the window is open, on the main thread only."""

    def __init__(self) -> None:
        self.open = False
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.started = (0.0, 0.0, 0.0)

    def start(self, *_) -> None:
        self.calls.clear()
        self.seconds.clear()
        self.started = (time.thread_time(), time.process_time(), time.monotonic())
        self.open = True

    def stop(self, *_) -> None:
        self.open = False
        now = (time.thread_time(), time.process_time(), time.monotonic())
        thread, process, wall = (end - begin for end, begin in zip(now, self.started, strict=True))
        result = {"pid": os.getpid(), "main_thread_s": thread, "process_s": process, "wall_s": wall,
                  "phases": {name: [self.calls[name], self.seconds[name]] for name in self.calls}}
        path = Path(os.environ.get("INFERNO_PHASE_DIR", ".")) / f"phase-{os.getpid()}.json"
        path.with_suffix(".part").write_text(json.dumps(result))
        path.with_suffix(".part").rename(path)  # whole when the reader sees it


WINDOW = _Window()


class _Timed:
    """A coroutine whose every resumption is timed (its waits are not)."""

    __slots__ = ("_coroutine", "_name")

    def __init__(self, coroutine, name: str):
        self._coroutine, self._name = coroutine, name

    def __await__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        return self._timed(self._coroutine.send, value)

    def throw(self, *args):
        return self._timed(self._coroutine.throw, *args)

    def close(self):
        return self._coroutine.close()

    def _timed(self, step, *args):
        started = time.thread_time()
        try:
            return step(*args)
        finally:
            WINDOW.seconds[self._name] += time.thread_time() - started


def timed(function, name: str):
    """`function` counted under `name` while the window is open, on the main thread."""
    main = threading.main_thread()
    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def start(*args, **kwargs):  # a coroutine function still: aiohttp and create_task take it so
            if not WINDOW.open or threading.current_thread() is not main:
                return await function(*args, **kwargs)
            WINDOW.calls[name] += 1
            return await _Timed(function(*args, **kwargs), name)
        return start

    @functools.wraps(function)
    def call(*args, **kwargs):
        if not WINDOW.open or threading.current_thread() is not main:
            return function(*args, **kwargs)
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            WINDOW.calls[name] += 1
            WINDOW.seconds[name] += time.thread_time() - started
    return call


def resolve(module_name: str, path: str) -> tuple[object, str, object]:
    """(the object holding it, its attribute name, the function) for `path` in `module_name`."""
    holder = importlib.import_module(module_name)
    *outer, name = path.split(".")
    for part in outer:
        holder = getattr(holder, part)
    return holder, name, getattr(holder, name)


def install(role: str) -> None:
    """Wrap `role`'s phases (a function also where another module took it by name) and take the window's
    signals."""
    for phase_role, module_name, path, _ in PHASES:
        if phase_role != role:
            continue
        holder, name, function = resolve(module_name, path)
        wrapped = timed(function, path)
        setattr(holder, name, wrapped)
        if "." in path:
            continue  # a method: every caller finds it on its class
        for module in list(sys.modules.values()):  # a function: also where a module took it by name
            ours = getattr(module, "__name__", "").startswith("orchestrator")
            if ours and getattr(module, name, None) is function:
                setattr(module, name, wrapped)
    signal.signal(START, WINDOW.start)
    signal.signal(STOP, WINDOW.stop)


def role_of(command_line: str) -> str | None:
    """The server's process (`inferno serve`, `python -m orchestrator serve`) or a worker; None: neither."""
    if "orchestrator.worker" in command_line:
        return "worker"
    server = "orchestrator" in command_line or "inferno" in command_line
    return "http" if server and " serve" in command_line else None


def report(results: dict[str, list[dict]], osl: int | None) -> dict:
    """Per role: requests in the window, the main thread's CPU per request, each phase's µs per request."""
    out = {}
    for role, files in results.items():
        calls: collections.Counter[str] = collections.Counter()
        seconds: collections.Counter[str] = collections.Counter()
        main_s = process_s = 0.0
        for result in files:
            main_s += result["main_thread_s"]
            process_s += result["process_s"]
            for name, (count, spent) in result["phases"].items():
                calls[name] += count
                seconds[name] += spent
        requests = calls[REQUESTS[role]] or 1
        top = sum(seconds[path] for r, _, path, is_top in PHASES if r == role and is_top)
        phases = {path: {"us_per_request": round(seconds[path] / requests * 1e6, 1),
                         "calls_per_request": round(calls[path] / requests, 2)}
                  for r, _, path, _ in PHASES if r == role and calls[path]}
        out[role] = {"processes": len(files), "requests": calls[REQUESTS[role]],
                     "main_thread_us_per_request": round(main_s / requests * 1e6, 1),
                     "process_us_per_request": round(process_s / requests * 1e6, 1),
                     "rest_of_thread_us_per_request": round((main_s - top) / requests * 1e6, 1),
                     "phases": phases}
        if osl:
            out[role]["main_thread_us_per_token"] = round(main_s / requests / osl * 1e6, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phase_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the server's pid (its workers: its children)")
    parser.add_argument("--window-s", type=float, default=12.0)
    parser.add_argument("--dir", type=Path, required=True, help="the server's INFERNO_PHASE_DIR")
    parser.add_argument("--osl", type=int, help="output tokens per request, for per-token figures")
    parser.add_argument("--out", type=Path, help="also write the report here as JSON")
    args = parser.parse_args(argv)
    server = psutil.Process(args.pid)
    roles = {p.pid: role_of(" ".join(p.cmdline())) for p in [server, *server.children(recursive=True)]}
    roles = {pid: role for pid, role in roles.items() if role is not None}
    for pid in roles:
        (args.dir / f"phase-{pid}.json").unlink(missing_ok=True)
        os.kill(pid, START)
    time.sleep(args.window_s)
    for pid in roles:
        os.kill(pid, STOP)
    paths = {pid: args.dir / f"phase-{pid}.json" for pid in roles}
    deadline = time.monotonic() + 10.0
    while not all(path.exists() for path in paths.values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # each process writes its counts at its next bytecode after the signal
    results: dict[str, list[dict]] = collections.defaultdict(list)
    for pid, role in roles.items():
        if paths[pid].exists():
            results[role].append(json.loads(paths[pid].read_text()))
    out = report(results, args.osl)
    for role, summary in out.items():
        token = summary.get("main_thread_us_per_token")
        per_token = f", {token} µs per token" if token is not None else ""
        main_us, rest_us = summary["main_thread_us_per_request"], summary["rest_of_thread_us_per_request"]
        print(f"{role}: {summary['requests']} requests, main thread {main_us} µs per request{per_token} "
              f"(rest of the thread {rest_us} µs)")
        for path, phase in summary["phases"].items():
            print(f"  {phase['us_per_request']:8.1f} µs  {phase['calls_per_request']:6.2f} calls  {path}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
