"""TensorRT-LLM's iteration stats as the backend's stats.

`get_latest_iteration_stats()` hands over every entry recorded since the previous call and empties the
executor's buffer, so two readers would each see half the story. The backend's `stats()` is the only
caller; this reader keeps what the newest entries say. The executor records an entry after every step,
and one more when its batch runs empty, so an idle engine reports 0 running requests.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.backends.protocol import BackendStats


class IterationStatsReader:
    def __init__(self, kv_blocks: int, tokens_per_block: int):
        """`kv_blocks` and `tokens_per_block` stand until the engine reports its own (after its first step)."""
        self._stats = BackendStats(0, 0, kv_blocks, kv_blocks, 0, tokens_per_block, 0)  # nothing running, every block free

    def read(self, entries) -> BackendStats:
        """Take in a drained batch of IterationStats, oldest first; return the current view."""
        for entry in entries:
            self._take(entry)
        return self._stats

    @property
    def current(self) -> BackendStats:
        return self._stats

    def _take(self, entry) -> None:
        stats = replace(self._stats, running=entry.num_active_requests, waiting=entry.num_queued_requests,
                        iterations=entry.iter)
        if entry.iter_latency_ms > 0:  # the entry for a batch running empty carries no step latency
            stats = replace(stats, iteration_latency_ms=float(entry.iter_latency_ms))
        kv = entry.kv_cache_stats
        if kv is not None:
            stats = replace(stats, kv_blocks_total=kv.max_num_blocks, kv_blocks_free=kv.free_num_blocks,
                            kv_blocks_used=kv.used_num_blocks, tokens_per_block=kv.tokens_per_block,
                            kv_blocks_reused=kv.reused_blocks)
        self._stats = stats
