"""The one narrow protocol every engine adapter implements; the worker process drives it.

Nothing above the worker knows which backend runs. The shape follows TensorRT-LLM's Executor (enqueue,
await responses, cancel, iteration stats, shutdown), and the engine step is the unit of output:

    start(outputs)   load weights, size the KV cache, start the engine loop; returns what it measured.
                     From then on the backend calls `outputs.step(deltas)` on the worker's event loop once per
                     engine step (or once for a few steps that finished together), with every request's new
                     tokens: one TokenDelta per request that has news, never one call per token or per request.
                     Outputs whose `any_thread` is true (the worker's) may be called from the backend's own
                     engine thread instead, sparing a wake-up of the event loop per step.
    submit(request)  enqueue; returns at once. Raises an InfernoError for a request the backend refuses before
                     it enters the engine (nothing is delivered for it then). Every accepted request gets
                     exactly one delta with `finish` set, its last: STOP, LENGTH, CANCELLED or ERROR.
    cancel(id)       end a request within one engine step; its final delta says CANCELLED. Unknown or
                     finished ids are ignored.
    stats()          a snapshot for /metrics and the scheduler, cheap and non-blocking
    close()          stop the engine; the worker process then exits and the memory goes back

What `start` and `stats` return (LoadReport, BackendStats) crosses to the HTTP process, so it is defined with
the other messages in ipc/messages.py. A per-request failure is that request's ERROR delta and never stops
the engine. When the engine itself stops for good, the backend calls `outputs.dead(reason)` once and delivers
nothing more; the worker then fails every live request and exits, so the server loads the model afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.backends.options import BackendOptions, options_model
from orchestrator.engine.manifest import EngineManifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams, TokenDelta
from orchestrator.errors import EngineDead, EngineError, ModelUnavailable


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What a backend's `start` tells the scheduler: where the engine runs (and, for a simulated device, what it
    holds there). The KV cache it really took is in its `stats()`."""

    device: str  # "cpu", "cuda:0"
    # What the model holds on its device, where the backend knows it better than a measurement of the worker
    # process can (a simulated GPU: weights + KV cache + runtime overhead). The memory ledger prefers it.
    device_bytes: int | None = None
    # Once `close` returns, everything the engine took is back with the system (host RAM only, no device
    # context left behind), so the worker process may load another model: an evicted model's worker becomes
    # the next spare instead of exiting.
    reusable: bool = False


@dataclass(frozen=True, slots=True)
class BackendStats:
    """A backend's `stats()`: its engine's numbers now, for /metrics and the admin API."""

    running: int  # requests in the engine's batch
    waiting: int  # submitted, not yet scheduled
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_used: int
    tokens_per_block: int
    iterations: int  # engine steps so far
    kv_blocks_reused: int | None = None  # cumulative prefix-cache hits in blocks, where the engine counts them
    iteration_latency_ms: float | None = None  # latest step's latency, where the engine reports it


@dataclass(frozen=True)
class BackendSettings:
    """What the worker hands a backend besides the engine folder's manifest.

    `options` is the backend's own section (backends/options.py; its defaults when left out), and must be the
    section of the backend the manifest names: ModelUnavailable otherwise."""

    engine_dir: Path
    manifest: EngineManifest
    kv_cache_bytes: int  # the budget the memory ledger assigned, in bytes
    options: BackendOptions | None = None
    weights_kept: bool = False  # the server kept the weights in host RAM since the model's last unload (LoadSpec)

    def __post_init__(self) -> None:
        backend = self.manifest.backend
        if self.options is None:
            object.__setattr__(self, "options", options_model(backend)())
        elif self.options.backend != backend:
            raise ModelUnavailable(
                f"options: the {self.options.backend} backend's options were given for an engine of backend {backend}"
            )


class EngineOutputs(Protocol):
    """Where a backend delivers its output; called on the worker's event loop, or from any thread where
    `any_thread` is true (such outputs serialise their calls themselves)."""

    def step(self, deltas: list[TokenDelta]) -> None: ...

    def dead(self, reason: str) -> None: ...


class Backend(Protocol):
    async def start(self, outputs: EngineOutputs) -> LoadReport: ...

    def submit(self, request: EngineRequest) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def stats(self) -> BackendStats: ...

    async def close(self) -> None: ...


class RequestStreams:
    """An `EngineOutputs` that hands each request's deltas to its own async iterator.

    For code that drives a backend in-process one request at a time (tests, the in-process benchmark, a
    backend's own warm-up); the worker does not use it: it handles each step's deltas together.
    """

    def __init__(self, backend: Backend | None = None):
        self.backend = backend
        self._queues: dict[str, asyncio.Queue] = {}
        self._dead: str | None = None

    def step(self, deltas: list[TokenDelta]) -> None:
        for delta in deltas:
            queue = self._queues.get(delta.request_id)
            if queue is not None:
                queue.put_nowait(delta)

    def dead(self, reason: str) -> None:
        self._dead = reason
        for queue in self._queues.values():
            queue.put_nowait(None)

    async def stream(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        """Submit `request` and yield its deltas up to and including the final one; EngineDead if the engine
        stops meanwhile. Leaving early cancels the request in the engine."""
        if self._dead is not None:
            raise EngineDead(f"the engine stopped: {self._dead}")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request.id] = queue
        finished = False
        try:
            self.backend.submit(request)
            while not finished:
                delta = await queue.get()
                if delta is None:
                    raise EngineDead(f"the engine stopped: {self._dead}")
                finished = delta.finish is not None
                yield delta
        finally:
            del self._queues[request.id]
            if not finished:
                self.backend.cancel(request.id)

    async def run(self, request: EngineRequest) -> list[TokenDelta]:
        """Every delta of one request, to its end."""
        return [delta async for delta in self.stream(request)]


WARMUP_ID = "warmup"
GREEDY = SamplingParams(temperature=0.0)


async def warm_up(streams: RequestStreams, pad_token_id: int, sampling: SamplingParams = GREEDY) -> None:
    """One short request through a backend's whole path, so the first user request does not pay for it."""
    request = EngineRequest(WARMUP_ID, (pad_token_id,) * 8, max_new_tokens=2, sampling=sampling)
    final = (await streams.run(request))[-1]
    if final.finish is FinishReason.ERROR:
        raise EngineError(f"the engine failed its warm-up request: {final.error}")


def hand_over(loop: asyncio.AbstractEventLoop, callback, argument) -> bool:
    """From an engine's thread: `callback(argument)` on the worker's event loop, soon. False when the loop is
    closed (the worker is exiting) and nothing was handed over."""
    try:
        loop.call_soon_threadsafe(callback, argument)
    except RuntimeError:
        return False
    return True
