"""Gauges read at scrape time: the scheduler's view of each model, and each engine's own stats.

The /metrics handler first asks every loaded worker for a stats snapshot (`refresh`, bounded by a short
timeout), then prometheus_client calls `collect`, which only reads plain data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.scheduler.scheduler import Scheduler
from orchestrator.scheduler.slots import ModelState

STATS_TIMEOUT_S = 0.5


class EngineCollector(Collector):
    def __init__(self, scheduler: Scheduler):
        self._scheduler = scheduler
        self.snapshots: dict[str, dict] = {}

    async def refresh(self) -> None:
        slots = [s for s in self._scheduler.slots.values() if s.state is ModelState.READY and s.worker]
        results = await asyncio.gather(*(s.worker.stats(STATS_TIMEOUT_S) for s in slots))
        self.snapshots = {slot.name: stats for slot, stats in zip(slots, results, strict=False) if stats is not None}

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "inferno_requests_running", "Requests admitted and running in the engine.", labels=["model"]
        )
        waiting = GaugeMetricFamily(
            "inferno_requests_waiting", "Requests queued for a running slot or a model load.", labels=["model"]
        )
        state = GaugeMetricFamily(
            "inferno_model_state", "1 for the model's current state, 0 for the others.", labels=["model", "state"]
        )
        for model in self._scheduler.snapshot():
            running.add_metric([model.name], model.running)
            waiting.add_metric([model.name], model.queued)
            for candidate in ModelState:
                state.add_metric([model.name, candidate.value], 1.0 if model.state == candidate.value else 0.0)
        yield running
        yield waiting
        yield state
        yield from self._engine_metrics()

    def _engine_metrics(self) -> Iterator[Metric]:
        engine_running = GaugeMetricFamily(
            "inferno_engine_requests_running", "Requests in the engine's current batch.", labels=["model"]
        )
        engine_waiting = GaugeMetricFamily(
            "inferno_engine_requests_waiting", "Requests inside the engine not yet scheduled.", labels=["model"]
        )
        blocks = GaugeMetricFamily(
            "inferno_kv_cache_blocks", "KV cache blocks by kind (total, free, used).", labels=["model", "kind"]
        )
        usage = GaugeMetricFamily(
            "inferno_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0 to 1).", labels=["model"]
        )
        per_block = GaugeMetricFamily(
            "inferno_kv_cache_tokens_per_block", "Tokens held by one KV cache block.", labels=["model"]
        )
        iterations = GaugeMetricFamily(
            "inferno_engine_iterations", "Engine steps since the model was loaded.", labels=["model"]
        )
        for name, stats in self.snapshots.items():
            engine_running.add_metric([name], stats["running"])
            engine_waiting.add_metric([name], stats["waiting"])
            for kind in ("total", "free", "used"):
                blocks.add_metric([name, kind], stats[f"kv_blocks_{kind}"])
            total = stats["kv_blocks_total"]
            usage.add_metric([name], stats["kv_blocks_used"] / total if total else 0.0)
            per_block.add_metric([name], stats["tokens_per_block"])
            iterations.add_metric([name], stats["iterations"])
        yield from (engine_running, engine_waiting, blocks, usage, per_block, iterations)
