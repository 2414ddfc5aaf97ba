"""CPU seconds of a process tree from /proc, split by process and by thread (Linux only).

A sample reads, for the root process and each live descendant, the process's own utime + stime (which
keeps the time of threads that have exited) and every live thread's (/proc/PID/task/TID/stat, named by
its comm). The difference of two samples is what each process and thread spent in between.
"""

from __future__ import annotations

import fnmatch
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")


def read_stat(path: Path) -> tuple[str, int]:
    """(comm, utime + stime in clock ticks) from a /proc stat file. The comm may hold spaces and
    parentheses, so the fields are split after its last ')'."""
    text = path.read_text()
    open_paren, close_paren = text.index("("), text.rindex(")")
    fields = text[close_paren + 2 :].split()
    return text[open_paren + 1 : close_paren], int(fields[11]) + int(fields[12])


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    name: str  # comm
    ticks: int  # the whole process, exited threads included
    threads: dict[int, tuple[str, int]] = field(default_factory=dict)  # tid -> (comm, ticks)


def sample_process(pid: int) -> ProcessSample | None:
    """One process and its threads; None when it has gone."""
    try:
        name, ticks = read_stat(PROC / str(pid) / "stat")
        threads = {}
        for task in (PROC / str(pid) / "task").iterdir():
            try:
                threads[int(task.name)] = read_stat(task / "stat")
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended while we read
        return ProcessSample(pid, name, ticks, threads)
    except (FileNotFoundError, ProcessLookupError):
        return None


def sample_tree(root_pid: int) -> dict[int, ProcessSample]:
    """The root process and every live descendant."""
    try:
        pids = [root_pid, *(child.pid for child in psutil.Process(root_pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return {}
    samples = (sample_process(pid) for pid in pids)
    return {sample.pid: sample for sample in samples if sample is not None}


@dataclass(frozen=True)
class ThreadCpu:
    name: str
    threads: int  # how many threads of this name did work
    cpu_s: float
    excluded: bool


@dataclass(frozen=True)
class ProcessCpu:
    pid: int
    role: str  # "http", "worker:<model>", "spare", ...
    name: str
    cpu_s: float
    excluded_cpu_s: float  # of threads matching the exclusion patterns
    threads: list[ThreadCpu]  # by name, busiest first; "(exited threads)" holds what ended in between
    started_in_between: bool


def _thread_deltas(before: ProcessSample | None, after: ProcessSample) -> dict[str, list[int]]:
    """Per thread name: the tick deltas of its threads (a thread born in between counts from zero)."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for tid, (name, ticks) in after.threads.items():
        start = before.threads.get(tid, (name, 0))[1] if before else 0
        by_name[name].append(ticks - start)
    return by_name


def process_cpu(before: ProcessSample | None, after: ProcessSample, role: str, exclude: tuple[str, ...]) -> ProcessCpu:
    """What one process spent between two samples (`before` None: it started in between)."""
    total = after.ticks - (before.ticks if before else 0)
    threads, accounted, excluded = [], 0, 0
    for name, deltas in _thread_deltas(before, after).items():
        ticks = sum(deltas)
        accounted += ticks
        is_excluded = any(fnmatch.fnmatchcase(name, pattern) for pattern in exclude)
        excluded += ticks if is_excluded else 0
        if ticks:
            threads.append(ThreadCpu(name, sum(1 for d in deltas if d), ticks / TICKS_PER_S, is_excluded))
    if total > accounted:
        threads.append(ThreadCpu("(exited threads)", 0, (total - accounted) / TICKS_PER_S, False))
    threads.sort(key=lambda t: -t.cpu_s)
    return ProcessCpu(
        after.pid, role, after.name, total / TICKS_PER_S, excluded / TICKS_PER_S, threads, before is None
    )


def tree_cpu(
    before: dict[int, ProcessSample], after: dict[int, ProcessSample], roles: dict[int, str], exclude: tuple[str, ...]
) -> tuple[list[ProcessCpu], list[int]]:
    """Every process alive at the end, and the pids of those that exited in between (their CPU is lost)."""
    processes = [
        process_cpu(before.get(pid), sample, roles.get(pid, f"child:{sample.name}"), exclude)
        for pid, sample in after.items()
    ]
    return processes, sorted(set(before) - set(after))
