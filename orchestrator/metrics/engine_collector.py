"""Gauges read at scrape time: the scheduler's view of each model and device, and each engine's own stats.

The /metrics handler first asks every loaded worker for a stats snapshot (`refresh`, bounded by a short
timeout), then prometheus_client calls `collect`, which only turns plain data into metric families.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from orchestrator.backends.protocol import BackendStats
from orchestrator.engine.catalogue import Engine
from orchestrator.metrics.scheduler_gauges import counter, device_families, gauge, model_families
from orchestrator.scheduler import Scheduler
from orchestrator.text.segments import SegmentCache

STATS_TIMEOUT_S = 0.5


class EngineCollector(Collector):
    def __init__(self, scheduler: Scheduler, engines: dict[str, Engine]):
        self._scheduler = scheduler
        self._engines = engines
        self.snapshots: dict[str, BackendStats] = {}  # model -> the stats its worker last sent

    async def refresh(self) -> None:
        self.snapshots = await self._scheduler.engine_stats(STATS_TIMEOUT_S)

    def collect(self) -> Iterator[Metric]:
        yield from model_families(self._scheduler.snapshot())
        yield from device_families(self._scheduler.device_memory())
        yield from engine_families(self.snapshots)
        yield segment_family({name: engine.prompts.segments for name, engine in self._engines.items()})


def segment_family(caches: dict[str, SegmentCache]) -> Metric:
    """The HTTP process's own count of prompt tokens in segments of long prompts (text/segments.py)."""
    tokens = counter("inferno_prompt_segment_tokens", "model result",
                     "Prompt tokens in segments of long prompts: found in the key's segment cache (hit), or "
                     "tokenised and kept there (miss).")
    for name, cache in caches.items():
        tokens.add_metric([name, "hit"], cache.hit_tokens)
        tokens.add_metric([name, "miss"], cache.miss_tokens)
    return tokens


def engine_families(snapshots: dict[str, BackendStats]) -> list[Metric]:
    """The engines' own numbers, as each worker's backend reports them."""
    running = gauge("inferno_engine_requests_running", "model", "Requests in the engine's current batch.")
    waiting = gauge("inferno_engine_requests_waiting", "model",
                    "Requests handed to the engine and not yet scheduled into its batch.")
    blocks = gauge("inferno_kv_cache_blocks", "model kind", "KV cache blocks by kind: total, free, used.")
    usage = gauge("inferno_kv_cache_usage_ratio", "model",
                  "Fraction of the KV cache's blocks in use, from 0 to 1.")
    per_block = gauge("inferno_kv_cache_tokens_per_block", "model", "Tokens one KV cache block holds.")
    iterations = gauge("inferno_engine_iterations", "model",
                       "Engine steps since the model was loaded (starts at 0 on each load).")
    reused = counter("inferno_kv_cache_reused_blocks", "model",
        "KV cache blocks reused from the prefix cache since the model was loaded, where the engine counts them.")
    step_latency = gauge("inferno_engine_iteration_latency_seconds", "model",
                         "Duration of the engine's latest step in seconds, where the engine reports it.")
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
