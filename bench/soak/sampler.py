"""Sampling the servers of a soak run over time.

For each server, every sample holds its HTTP process and each child process (named as `inferno bench` names
them: `http`, `worker:<model>` from /admin/models, `spare`, else `child:<name>`) with its resident memory,
open file descriptors and threads, keyed by pid since workers come and go with swaps; and, from /metrics,
the HTTP process's live asyncio tasks (`inferno_event_loop_tasks`) and the requests in flight (running in
an engine or waiting for one, over all models).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from dataclasses import dataclass

import psutil
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.bench.targets import inferno_roles

IN_FLIGHT = ("inferno_requests_running", "inferno_requests_waiting")


@dataclass(frozen=True)
class Watched:
    """A server under watch: its name in the run, its root process, its base URL."""

    name: str
    pid: int
    base_url: str


def read_metrics(base_url: str, timeout_s: float = 10) -> dict:
    """From /metrics: the event loop's tasks and the requests in flight (None where a family is missing)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    tasks, in_flight = None, None
    for family in text_string_to_metric_families(text):
        if family.name == "inferno_event_loop_tasks" and family.samples:
            tasks = int(family.samples[0].value)
        elif family.name in IN_FLIGHT:
            in_flight = (in_flight or 0) + int(sum(sample.value for sample in family.samples))
    return {"tasks": tasks, "in_flight": in_flight}


def process_stats(pid: int) -> dict | None:
    """RSS, open fds and threads of one process; None when it has gone."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return {"pid": pid, "name": process.name(), "rss_bytes": process.memory_info().rss,
                    "fds": process.num_fds(), "threads": process.num_threads()}
    except psutil.Error:
        return None


def sample_server(server: Watched) -> dict:
    """One sample of one server (blocking: run it on a thread). The processes are read before the sample's
    own requests (/admin/models for their names, /metrics), so that their sockets are not counted."""
    try:
        children = [child.pid for child in psutil.Process(server.pid).children(recursive=True)]
    except psutil.Error:
        children = []
    found = [stats for stats in map(process_stats, (server.pid, *children)) if stats is not None]
    roles = inferno_roles(f"{server.base_url}/v1", None)(server.pid)
    processes = []
    for stats in found:
        name = stats.pop("name")
        processes.append({"pid": stats["pid"], "role": roles.get(stats["pid"]) or f"child:{name}", **stats})
    try:
        metrics = read_metrics(server.base_url)
    except OSError as exc:  # counted against the run: the quiet checks need these numbers
        metrics = {"tasks": None, "in_flight": None, "scrape_error": str(exc)[:200]}
    return {"processes": processes, "children": len(children), **metrics}


class Sampler:
    """Samples every server each `interval_s` while `phase` is set (the run sets it; None pauses sampling)."""

    def __init__(self, servers: list[Watched], interval_s: float, started: float):
        self.servers = servers
        self.interval_s = interval_s
        self.started = started
        self.phase: str | None = None
        self.samples: list[dict] = []

    async def take(self, phase: str) -> dict:
        at = time.monotonic() - self.started
        found = await asyncio.gather(*(asyncio.to_thread(sample_server, server) for server in self.servers))
        sample = {"t": round(at, 3), "phase": phase,
                  "servers": {server.name: one for server, one in zip(self.servers, found, strict=True)}}
        self.samples.append(sample)
        return sample

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            started = time.monotonic()
            if self.phase is not None:
                await self.take(self.phase)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
