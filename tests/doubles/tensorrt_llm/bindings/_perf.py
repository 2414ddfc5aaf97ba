"""One request's performance metrics inside the test double of TensorRT-LLM's Executor, kept as 1.2's
LlmRequest keeps them (the facts table's "perf metrics" facts): the KV cache counts are taken when the
request's first context chunk is scheduled, the first iteration and token time at its first step, the last
ones when it finishes; every result of a request that asked for them carries a copy of what they are then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from tensorrt_llm.bindings._prefix import BlockReuse
from tensorrt_llm.bindings._results import RequestPerfMetrics


def now() -> timedelta:
    """The steady clock, as the bindings hand its time points over: a duration since the clock's epoch."""
    return timedelta(seconds=time.monotonic())


@dataclass
class PerfRecord:
    arrived: timedelta
    scheduled: timedelta = field(default_factory=now)
    reuse: BlockReuse = field(default_factory=BlockReuse)
    first_iter: int | None = None
    iter: int | None = None
    last_iter: int | None = None
    first_token: timedelta = timedelta(0)
    last_token: timedelta = timedelta(0)

    def on_step(self, iteration: int, finished: bool) -> None:
        """After each step the request took part in."""
        if self.first_iter is None:
            self.first_iter, self.first_token = iteration, now()
        self.iter = iteration
        if finished:
            self.last_iter, self.last_token = iteration, now()

    def metrics(self) -> RequestPerfMetrics:
        """A copy for one result: later steps do not change what an earlier result carries."""
        metrics = RequestPerfMetrics()
        timing = metrics.timing_metrics
        timing.arrival_time, timing.first_scheduled_time = self.arrived, self.scheduled
        timing.first_token_time, timing.last_token_time = self.first_token, self.last_token
        kv, reuse = metrics.kv_cache_metrics, self.reuse
        kv.num_total_allocated_blocks = kv.num_new_allocated_blocks = reuse.allocated
        kv.num_reused_blocks, kv.num_missed_blocks = reuse.reused, reuse.missed
        kv.kv_cache_hit_rate = reuse.reused / (reuse.reused + reuse.missed) if reuse.reused else 0.0
        metrics.first_iter, metrics.iter, metrics.last_iter = self.first_iter, self.iter, self.last_iter
        return metrics
