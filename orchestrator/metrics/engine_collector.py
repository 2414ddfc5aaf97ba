"""Gauges read at scrape time: the scheduler's view of each model and device, and each engine's own stats.

The /metrics handler first asks every loaded worker for a stats snapshot (`refresh`, bounded by a short
timeout), then prometheus_client calls `collect`, which only turns plain data into metric families.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.backends.protocol import BackendStats
from orchestrator.metrics.scheduler_gauges import device_families, model_families
from orchestrator.scheduler import Scheduler

STATS_TIMEOUT_S = 0.5


class EngineCollector(Collector):
    def __init__(self, scheduler: Scheduler):
        self._scheduler = scheduler
        self.snapshots: dict[str, BackendStats] = {}  # model -> the stats its worker last sent

    async def refresh(self) -> None:
        self.snapshots = await self._scheduler.engine_stats(STATS_TIMEOUT_S)

    def collect(self) -> Iterator[Metric]:
        yield from model_families(self._scheduler.snapshot())
        yield from device_families(self._scheduler.device_memory())
        yield from engine_families(self.snapshots)


def engine_families(snapshots: dict[str, BackendStats]) -> list[Metric]:
    """The engines' own numbers, as each worker's backend reports them."""
    running = GaugeMetricFamily(
        "inferno_engine_requests_running", "Requests in the engine's current batch.", labels=["model"]
    )
    waiting = GaugeMetricFamily(
        "inferno_engine_requests_waiting",
        "Requests handed to the engine and not yet scheduled into its batch.",
        labels=["model"],
    )
    blocks = GaugeMetricFamily(
        "inferno_kv_cache_blocks", "KV cache blocks by kind: total, free, used.", labels=["model", "kind"]
    )
    usage = GaugeMetricFamily(
        "inferno_kv_cache_usage_ratio", "Fraction of the KV cache's blocks in use, from 0 to 1.", labels=["model"]
    )
    per_block = GaugeMetricFamily(
        "inferno_kv_cache_tokens_per_block", "Tokens one KV cache block holds.", labels=["model"]
    )
    iterations = GaugeMetricFamily(
        "inferno_engine_iterations", "Engine steps since the model was loaded (starts at 0 on each load).",
        labels=["model"],
    )
    reused = CounterMetricFamily(
        "inferno_kv_cache_reused_blocks",
        "KV cache blocks reused from the prefix cache since the model was loaded, where the engine counts them.",
        labels=["model"],
    )
    step_latency = GaugeMetricFamily(
        "inferno_engine_iteration_latency_seconds",
        "Duration of the engine's latest step in seconds, where the engine reports it.",
        labels=["model"],
    )
    for name, stats in snapshots.items():
        running.add_metric([name], stats.running)
        waiting.add_metric([name], stats.waiting)
        for kind, count in (("total", stats.kv_blocks_total), ("free", stats.kv_blocks_free),
                            ("used", stats.kv_blocks_used)):
            blocks.add_metric([name, kind], count)
        total = stats.kv_blocks_total
        usage.add_metric([name], stats.kv_blocks_used / total if total else 0.0)
        per_block.add_metric([name], stats.tokens_per_block)
        iterations.add_metric([name], stats.iterations)
        if stats.kv_blocks_reused is not None:
            reused.add_metric([name], stats.kv_blocks_reused)
        if stats.iteration_latency_ms is not None:
            step_latency.add_metric([name], stats.iteration_latency_ms / 1000.0)
    return [running, waiting, blocks, usage, per_block, iterations, reused, step_latency]
