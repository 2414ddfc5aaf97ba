"""The model table: each model's entry in the server (settings, load state, worker, counters, admission
queue), shared by admission (admission.py) and placement (placement.py)."""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import StrEnum

from orchestrator.config import ServerConfig
from orchestrator.engine.catalogue import Catalogue, Engine
from orchestrator.engine.logits import engine_vocab_size, logits_pool
from orchestrator.lifecycle import InferenceRequest
from orchestrator.scheduler.fairness import ANONYMOUS_TENANT, KeyShares, Metered, Tenant
from orchestrator.scheduler.observe import KeptSnapshot, ModelSnapshot, PoolSnapshot
from orchestrator.scheduler.policy import KeyLoad, ModelLoad
from orchestrator.scheduler.settings import ModelSettings, Priority, load_model_settings
from orchestrator.supervisor.handle import WorkerHandle


class ModelState(StrEnum):
    UNLOADED = "unloaded"  # a request loads it (also after a crash, once any backoff is over)
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"  # its last load failed, or its worker crashed again within the backoff: see retry_at


@dataclass(order=True)
class Waiter:
    """A request waiting for a permit; ordered best first (higher priority, then earlier)."""

    sort_key: tuple
    future: asyncio.Future = field(compare=False)
    priority: Priority = field(compare=False)
    arrival: int = field(compare=False)
    tenant: Tenant = field(default=ANONYMOUS_TENANT, compare=False)
    request: Metered | None = field(default=None, compare=False)  # charged to its key once granted
    logits_bytes: int = field(default=0, compare=False)  # its draw on the model's generation logits pool
    waiting_for: str = field(default="", compare=False)  # why it waits beyond a permit (policy.draw_logits's reason)

    @classmethod
    def make(cls, priority: Priority, arrival: int, tenant: Tenant = ANONYMOUS_TENANT,
             request: Metered | None = None, logits_bytes: int = 0) -> Waiter:
        future = asyncio.get_running_loop().create_future()
        return cls((-int(priority), arrival), future, priority, arrival, tenant, request, logits_bytes)

    @property
    def granted(self) -> bool:
        """Given a permit (its future holds a result, not a refusal or a cancellation)."""
        return self.future.done() and not self.future.cancelled() and self.future.exception() is None


@dataclass
class ModelEntry:
    """The scheduler's record of one served model. `running` counts the permits its requests hold (at most
    `max_concurrency`); `waiters` wait for one."""

    engine: Engine
    settings: ModelSettings
    max_concurrency: int
    max_queue: int
    pinned: bool = False
    state: ModelState = ModelState.UNLOADED
    worker: WorkerHandle | None = None
    running: int = 0
    waiters: list[Waiter] = field(default_factory=list)
    shares: KeyShares = field(default_factory=KeyShares)  # fairness between the keys using it
    last_used: float = 0.0  # when it last finished a request (the scheduler's clock)
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    crashes: int = 0
    consecutive_failures: int = 0
    retry_at: float = 0.0  # no load before this (monotonic), after failures
    last_error: str | None = None
    load_task: asyncio.Task | None = None
    unload_task: asyncio.Task | None = None
    idle_timer: asyncio.TimerHandle | None = None  # the timers are kept once fired: cancelling one then does nothing
    retry_timer: asyncio.TimerHandle | None = None  # ends a backoff: a crashed model unloaded, a pinned one reloaded
    waiting_for_room: str | None = None  # why its load waits for memory, while it does
    logits_used: int = 0  # bytes of its generation logits pool (engine.logits_pool) drawn by admitted requests

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def queued(self) -> int:
        return len(self.waiters)

    @property
    def idle(self) -> bool:
        return self.running == 0 and not self.waiters and self.state is ModelState.READY

    def enqueue(self, waiter: Waiter) -> None:
        bisect.insort(self.waiters, waiter)

    def queued_by_key(self) -> Counter[str]:
        return Counter(waiter.tenant.key for waiter in self.waiters)

    def key_loads(self, now: float) -> list[KeyLoad]:
        """Every key's state on this model, with the best class each has waiting (its oldest waiter of it)."""
        heads: dict[str, Waiter] = {}
        for waiter in self.waiters:  # best first, so a key's first waiter is its head
            heads.setdefault(waiter.tenant.key, waiter)
        loads = self.shares.loads(self.queued_by_key(), now)
        return [replace(load, head_priority=heads[load.key].priority, head_arrival=heads[load.key].arrival)
                if load.key in heads else load for load in loads]

    def head_of(self, key: str) -> int:
        """Where the key's best waiter (highest priority, oldest) is in the queue."""
        return next(i for i, waiter in enumerate(self.waiters) if waiter.tenant.key == key)

    def logits_draw(self, request: InferenceRequest) -> int:
        """Bytes of the model's generation logits pool the request holds while it runs: 0 without a pool or without
        top_logprobs. Raises the 400 for a request larger than the whole pool (the HTTP side refuses it first,
        naming the field as its wire spells it)."""
        pool = self.engine.logits_pool
        if pool is None:
            return 0
        asking = [c.engine_request.max_new_tokens for c in request.choices if c.engine_request.top_logprobs > 0]
        if not asking:
            return 0
        pool.check_fits(max(asking), len(asking), "max_tokens")
        return pool.draw(sum(asking), 1)

    def load_view(self) -> ModelLoad:
        head = self.waiters[0] if self.waiters else None
        return ModelLoad(name=self.name, running=self.running, queued=self.queued,
                         max_concurrency=self.max_concurrency, max_queue=self.max_queue,
                         weight=self.settings.weight, head_priority=head.priority if head else None,
                         head_arrival=head.arrival if head else 0)

    def cancel_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def cancel_retry_timer(self) -> None:
        if self.retry_timer is not None:
            self.retry_timer.cancel()

    def retry_in(self, now: float) -> float:
        """Seconds until the next load may be tried (0: now)."""
        return max(0.0, self.retry_at - now)

    def snapshot(self, memory_bytes: int, now: float, kept: KeptSnapshot | None = None) -> ModelSnapshot:
        ready = self.state is ModelState.READY
        pool = self.engine.logits_pool
        return ModelSnapshot(
            name=self.name,
            backend=self.engine.manifest.backend,
            state=self.state.value,
            pinned=self.pinned,
            running=self.running if ready else 0,
            queued=self.queued + (0 if ready else self.running),  # holding a permit while the model loads
            loads=self.loads,
            load_failures=self.load_failures,
            evictions=self.evictions,
            crashes=self.crashes,
            memory_bytes=memory_bytes,
            idle_seconds=0.0 if self.running else now - self.last_used,
            last_error=self.last_error,
            pid=self.worker.pid if self.worker else None,
            retry_in_s=round(self.retry_in(now), 3) if self.state is ModelState.FAILED else None,
            generation_logits_pool=None if pool is None else PoolSnapshot(pool.pool_bytes, self.logits_used),
            kept_weights=kept,
        )


def build_entries(config: ServerConfig, catalogue: Catalogue, now: float) -> dict[str, ModelEntry]:
    """An entry per servable engine, with its settings (the model settings file over the config)."""
    settings = load_model_settings(config, list(catalogue.engines))
    entries: dict[str, ModelEntry] = {}
    for name, engine in catalogue.engines.items():
        own = settings[name]
        batch = engine.manifest.limits.max_batch_size
        limit = own.max_concurrency or config.scheduling.max_concurrency or batch
        entries[name] = ModelEntry(
            engine=_as_served(engine, own),
            settings=own,
            max_concurrency=min(limit, batch),
            max_queue=own.max_queue if own.max_queue is not None else config.scheduling.max_queue,
            pinned=own.pinned,
            last_used=now,
            shares=KeyShares(config.scheduling.key_presence_s),
        )
    return entries


def _as_served(engine: Engine, settings: ModelSettings) -> Engine:
    """The engine with what the model's settings change: `generation_logits` in its manifest (a runtime setting of
    TensorRT-LLM's executor, so the HTTP side's feature check and the load agree) and the pool its buffers draw
    from (`generation_logits_bytes`), and `retain_system_prompt`
    (so the HTTP side counts system prefixes only for models that keep them), and `special_tokens_in_content` (how
    the HTTP side tokenises a conversation)."""
    if settings.retain_system_prompt:
        engine = replace(engine, retain_system_prompt=True)
    if settings.special_tokens_in_content:
        engine = replace(engine, special_tokens_in_content=True)
    if settings.generation_logits is not None and settings.generation_logits != engine.manifest.generation_logits:
        engine = replace(engine, manifest=engine.manifest.model_copy(
            update={"generation_logits": settings.generation_logits}))
    if engine.manifest.backend == "trtllm" and engine.manifest.generation_logits:
        engine = replace(engine, logits_pool=logits_pool(engine.manifest, _vocab_size(engine),
                                                         settings.generation_logits_bytes))
    return engine


def _vocab_size(engine: Engine) -> int:
    """The engine's vocabulary (its config.json's), else its tokenizer's."""
    vocab = engine_vocab_size(engine.folder)
    if vocab is None and engine.prompts is not None:
        vocab = engine.prompts.tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab is None:
        raise ValueError(f"{engine.folder / 'config.json'} does not say the model's vocab_size")
    return vocab
