"""The one narrow protocol every engine adapter implements; the worker process drives it.

Nothing above the worker knows which backend runs. The shape follows TensorRT-LLM's Executor (enqueue,
await responses, cancel, iteration stats, shutdown) and fits transformers' continuous batching manager
as well:

    start()          load weights, size the KV cache, start the engine loop; returns what it measured
    submit(request)  -> async iterator of TokenDelta (new tokens only), ending with a finish reason
    cancel(id)       stop a request within one engine step; its stream still ends (finish=CANCELLED)
    stats()          a snapshot for /metrics and the scheduler, cheap and non-blocking
    close()          stop the engine; the worker process then exits and the memory goes back
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.engine.manifest import EngineManifest
from orchestrator.engine.request import EngineRequest, TokenDelta


@dataclass(frozen=True)
class BackendSettings:
    """What the worker hands a backend besides the engine folder's manifest."""

    engine_dir: Path
    manifest: EngineManifest
    kv_cache_bytes: int  # the budget the memory ledger assigned, in bytes
    device: str = "auto"  # hf only: auto | cpu | cuda
    threads: int | None = None  # hf only: CPU threads
    capacity_policy: str = "guaranteed_no_evict"  # trtllm only: or max_utilization


@dataclass(frozen=True)
class LoadReport:
    device: str  # "cpu", "cuda:0"
    kv_cache_bytes: int  # what the cache really took
    kv_blocks: int
    tokens_per_block: int
    max_batch_size: int


@dataclass(frozen=True)
class BackendStats:
    running: int  # requests in the engine's batch
    waiting: int  # submitted, not yet scheduled
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_used: int
    tokens_per_block: int
    iterations: int  # engine steps so far
    kv_blocks_reused: int | None = None  # cumulative prefix-cache hits in blocks, where the engine counts them
    iteration_latency_ms: float | None = None  # latest step's latency, where the engine reports it


class Backend(Protocol):
    async def start(self) -> LoadReport: ...

    def submit(self, request: EngineRequest) -> AsyncIterator[TokenDelta]: ...

    def cancel(self, request_id: str) -> None: ...

    def stats(self) -> BackendStats: ...

    async def close(self) -> None: ...
