"""Percentiles, summaries and CPU accounting from /proc."""

from __future__ import annotations

import psutil


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU of a process (and, by default, its live descendants), from /proc via psutil."""
    process = psutil.Process(pid)
    tree = [process, *process.children(recursive=True)] if children else [process]
    total = 0.0
    for member in tree:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
