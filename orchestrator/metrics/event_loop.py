"""The HTTP process's event loop, read at scrape time: how many asyncio tasks are alive on it.

Every request, stream and background job of the HTTP process is a task on this one loop, so a count that
keeps rising under steady traffic, or does not come back down when traffic stops, is a leak (a soak run,
`python -m bench.soak` from a checkout, watches it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class EventLoopCollector(Collector):
    """`inferno_event_loop_tasks`: the live tasks of the loop the scrape runs on (the /metrics handler's own
    task included). Declared without a sample when collected outside a running loop."""

    def collect(self) -> Iterator[Metric]:
        tasks = GaugeMetricFamily(
            "inferno_event_loop_tasks",
            "Live asyncio tasks on the HTTP process's event loop, counted at scrape time (the scrape's own included).",
        )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            tasks.add_metric([], len(asyncio.all_tasks(loop)))
        yield tasks
