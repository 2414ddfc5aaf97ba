"""Admission and model placement: which requests run now, which wait, which are turned away, and which
models are loaded where. Decisions come from `policy` (pure functions); this module gathers the state they
need and carries them out.

The request path holds a *lease* while its engine requests run:

    async with scheduler.lease(request, priority) as worker:
        worker.submit(...)

Entering waits for a running slot (bounded queue, timeout) and for the model's worker to be loaded, which
may evict idle models; leaving cancels whatever is unfinished in the engine and hands the slot on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator

from orchestrator.config import ServerConfig
from orchestrator.errors import InfernoError, ModelNotFound, ModelUnavailable, QueueFull, ShuttingDown
from orchestrator.lifecycle import InferenceRequest, RequestStatus
from orchestrator.scheduler import policy
from orchestrator.scheduler.ledger import DeviceProbe, MemoryLedger, detect_probe
from orchestrator.scheduler.observe import DeviceMemory, ModelSnapshot, NoEvents, SchedulerEvents
from orchestrator.scheduler.policy import Admission, Placement, Resident
from orchestrator.scheduler.registry import Catalogue
from orchestrator.scheduler.settings import Priority, load_model_settings
from orchestrator.scheduler.slots import ModelSlot, ModelState, Waiter
from orchestrator.sim.device import simulated_device
from orchestrator.worker.client import WorkerClient
from orchestrator.worker.main import LoadSpec
from orchestrator.worker.process import WorkerPool

log = logging.getLogger(__name__)

RETRY_AFTER_BUSY_S = 5.0
SPARE_REFILL_IDLE_S = 1.0  # quiet time before a new spare worker starts importing its runtimes (when-idle)
EAGER_REFILL_CORES = 8  # with this many cores a spare's imports hardly compete with serving


class Scheduler:
    def __init__(
        self,
        config: ServerConfig,
        catalogue: Catalogue,
        events: SchedulerEvents | None = None,
        probe: DeviceProbe | None = None,
    ):
        self._config = config
        self._catalogue = catalogue
        self._events = events or NoEvents()
        settings = load_model_settings(config, list(catalogue.engines))
        self.slots: dict[str, ModelSlot] = {}
        for name, engine in catalogue.engines.items():
            own = settings[name]
            limit = own.max_concurrency or config.scheduling.max_concurrency
            self.slots[name] = ModelSlot(
                engine=engine,
                settings=own,
                max_concurrency=min(limit, engine.manifest.limits.max_batch_size),
                max_queue=own.max_queue if own.max_queue is not None else config.scheduling.max_queue,
                pinned=own.pinned,
            )
        memory = config.memory
        probe = probe or simulated_device(catalogue.engines) or detect_probe(config.worker.device, memory.gpu_index)
        self.ledger = MemoryLedger(probe, memory.capacity_bytes, memory.reserve_bytes)
        backends = tuple(sorted({e.manifest.backend for e in catalogue.engines.values()}))
        self.pool = WorkerPool(backends, config.log_level, keep_spare=config.worker.spare)
        self._placement = asyncio.Lock()  # one placement plan (and its evictions) at a time
        self._capacity = asyncio.Event()  # replaced on every notify: waiters hold the one they saw
        self._arrivals = itertools.count()
        self._draining = False
        self._started = False
        self._refill_timer: asyncio.TimerHandle | None = None
        refill = config.worker.spare_refill
        if refill == "auto":
            refill = "after-load" if (os.cpu_count() or 1) >= EAGER_REFILL_CORES else "when-idle"
        self._refill_after_load = refill == "after-load"
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load pinned models, then (preload=fit) every other model that fits without evicting."""
        pinned = [s for s in self.slots.values() if s.pinned]
        others = [s for s in self.slots.values() if not s.pinned]
        for slot in pinned:
            with contextlib.suppress(InfernoError):
                await self._ensure_loaded(slot)
        if self._config.scheduling.preload == "fit":
            for slot in others:
                if self._estimate(slot) <= self.ledger.free():
                    with contextlib.suppress(InfernoError):
                        await self._ensure_loaded(slot)
        self._started = True
        self.pool.refill()

    @property
    def ready(self) -> bool:
        """Serving: started, every pinned model loaded, no model that was loaded at start has failed."""
        if not self._started or self._draining or not self.slots:
            return False
        return all(s.state is ModelState.READY for s in self.slots.values() if s.pinned) and not any(
            s.state is ModelState.FAILED and s.loads == 0 and s.load_failures for s in self.slots.values()
        )

    def begin_drain(self) -> None:
        """From now on, new requests get 503 and queued ones are turned away; running ones go on."""
        self._draining = True
        for slot in self.slots.values():
            for waiter in slot.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(ShuttingDown("the server is shutting down"))
            slot.waiters.clear()

    async def stop(self, drain_timeout_s: float) -> None:
        """Refuse new requests, let running ones finish for up to drain_timeout_s, then stop every worker."""
        self.begin_drain()
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        except TimeoutError:
            log.warning("drain timed out after %.0f s: cancelling what is still running", drain_timeout_s)
        for slot in self.slots.values():
            slot.cancel_idle_timer()
        if self._refill_timer is not None:
            self._refill_timer.cancel()
        await asyncio.gather(*(self._unload(slot, "shutdown") for slot in self.slots.values()))
        await self.pool.close()

    # -- what the outside sees ------------------------------------------------------------------------------
    def snapshot(self) -> list[ModelSnapshot]:
        return [slot.snapshot(self.ledger.footprint(slot.name)) for slot in self.slots.values()]

    def device_memory(self) -> list[DeviceMemory]:
        reading = self.ledger.probe.read()
        return [DeviceMemory(self.ledger.probe.name, self.ledger.capacity, reading.used_bytes, self.ledger.reserve)]

    async def engine_stats(self, timeout_s: float) -> dict[str, dict]:
        """Each loaded model's engine stats (`BackendStats` as a dict); a worker that does not answer within
        timeout_s is left out."""
        loaded = {n: s.worker for n, s in self.slots.items() if s.state is ModelState.READY and s.worker}
        answers = await asyncio.gather(*(worker.stats(timeout_s) for worker in loaded.values()))
        return {name: stats for name, stats in zip(loaded, answers, strict=True) if stats is not None}

    def slot_for(self, model: str) -> ModelSlot:
        slot = self.slots.get(model)
        if slot is not None:
            return slot
        refused = self._catalogue.refused.get(model)
        if refused is not None:
            raise ModelUnavailable(f"model '{model}' cannot be served: {refused}", param="model")
        raise ModelNotFound(
            f"the model '{model}' does not exist; models served here: {', '.join(sorted(self.slots)) or 'none'}",
            param="model",
        )

    # -- the request path ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, request: InferenceRequest, priority: Priority | None = None) -> AsyncIterator[WorkerClient]:
        slot = self.slot_for(request.model)
        self._check_backoff(slot)
        await self._acquire(slot, slot.settings.priority_class if priority is None else priority)
        worker = None
        try:
            worker = await self._ensure_loaded(slot)
            request.start()
            yield worker
        finally:
            if worker is not None:
                for engine_id in request.unfinished_engine_ids():
                    worker.cancel(engine_id)
            if request.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
                slot.consecutive_failures = 0
            slot.last_used = time.monotonic()
            self._release(slot)

    def _check_backoff(self, slot: ModelSlot) -> None:
        wait = slot.retry_at - time.monotonic()
        if slot.state is ModelState.FAILED and wait > 0:
            raise ModelUnavailable(
                f"model '{slot.name}' is failing ({slot.last_error}); the next attempt is in {wait:.0f} s",
                retry_after_s=wait,
            )

    def _total_running(self) -> int:
        return sum(s.running for s in self.slots.values())

    async def _acquire(self, slot: ModelSlot, priority: Priority) -> None:
        if self._draining:
            raise ShuttingDown("the server is shutting down and takes no new requests")
        slot.cancel_idle_timer()
        decision = policy.admit(slot.load_view(), self._total_running(), self._config.scheduling.max_running_total)
        if decision is Admission.RUN:
            self._take(slot)
            return
        if decision is Admission.REJECT:
            raise QueueFull(
                f"model '{slot.name}' has {slot.queued} requests queued (the limit is {slot.max_queue}); retry shortly",
                retry_after_s=1.0,
            )
        waiter = Waiter.make(priority, next(self._arrivals))
        slot.enqueue(waiter)
        timeout = self._config.scheduling.queue_timeout_s
        try:
            await asyncio.wait_for(waiter.future, timeout)
        except BaseException as exc:
            if waiter in slot.waiters:
                slot.waiters.remove(waiter)
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self._release(slot)  # granted just as we gave up: pass it on
            if isinstance(exc, TimeoutError):
                raise ModelUnavailable(
                    f"model '{slot.name}' stayed busy for {timeout:.0f} s; retry later", retry_after_s=RETRY_AFTER_BUSY_S
                ) from None
            raise

    def _take(self, slot: ModelSlot) -> None:
        slot.running += 1
        self._idle.clear()
        if self._refill_timer is not None:
            self._refill_timer.cancel()
            self._refill_timer = None

    def _release(self, slot: ModelSlot) -> None:
        slot.running -= 1
        self._dispatch()
        if slot.idle:
            self._on_idle(slot)
        if all(s.running == 0 for s in self.slots.values()):
            self._idle.set()
            self._refill_spare_when_idle()

    def _refill_spare_when_idle(self) -> None:
        """A new spare imports its runtimes at full speed for seconds. On a small machine (when-idle) it starts
        only once nothing has run for a moment, so it does not slow down the requests that follow a load."""
        if self._refill_after_load:
            self.pool.refill()
            return
        if self._refill_timer is not None:
            self._refill_timer.cancel()
        self._refill_timer = asyncio.get_running_loop().call_later(SPARE_REFILL_IDLE_S, self._refill_if_idle)

    def _refill_if_idle(self) -> None:
        self._refill_timer = None
        if self._total_running() == 0 and not self._draining:
            self.pool.refill()

    def _dispatch(self) -> None:
        """Hand free running slots to waiters, in the order the policy picks."""
        limit = self._config.scheduling.max_running_total
        while True:
            views = [s.load_view() for s in self.slots.values() if s.waiters]
            name = policy.pick_next(views, self._total_running(), limit)
            if name is None:
                return
            slot = self.slots[name]
            waiter = slot.waiters.pop(0)
            if not waiter.future.done():
                self._take(slot)
                waiter.future.set_result(True)

    # -- idleness -----------------------------------------------------------------------------------------
    def _on_idle(self, slot: ModelSlot) -> None:
        self._notify_capacity()  # an idle model can now be evicted
        delay = policy.idle_unload_delay(slot.settings.keep_alive_s, slot.pinned)
        if delay is None:
            return
        slot.cancel_idle_timer()
        slot.idle_timer = asyncio.get_running_loop().call_later(delay, self._unload_if_idle, slot)

    def _unload_if_idle(self, slot: ModelSlot) -> None:
        slot.idle_timer = None
        if slot.idle and not slot.pinned:
            self._start_unload(slot, "idle")

    # -- placement ----------------------------------------------------------------------------------------
    def _estimate(self, slot: ModelSlot) -> int:
        manifest = slot.engine.manifest
        return self.ledger.estimate(
            slot.name, manifest.weights_bytes, self._kv_bytes(slot), self._config.memory.overhead_bytes
        )

    def _kv_bytes(self, slot: ModelSlot) -> int:
        return slot.settings.kv_cache_bytes or slot.engine.manifest.kv_cache.default_budget_bytes

    def _residents(self) -> list[Resident]:
        return [
            Resident(s.name, self.ledger.footprint(s.name), s.pinned, s.idle, s.last_used)
            for s in self.slots.values()
            if s.state in (ModelState.READY, ModelState.LOADING)
        ]

    def _notify_capacity(self) -> None:
        self._capacity.set()
        self._capacity = asyncio.Event()

    async def _ensure_loaded(self, slot: ModelSlot) -> WorkerClient:
        if slot.state is ModelState.READY and slot.worker is not None and slot.worker.alive:
            return slot.worker
        if slot.load_task is None or slot.load_task.done():
            slot.load_task = asyncio.create_task(self._load(slot), name=f"load-{slot.name}")
        await asyncio.shield(slot.load_task)
        return slot.worker

    async def _load(self, slot: ModelSlot) -> None:
        if slot.unload_task is not None and not slot.unload_task.done():
            await slot.unload_task  # an eviction of this model is finishing: load it afresh after
        self._check_backoff(slot)
        need = self._estimate(slot)
        await self._make_room(slot, need)
        slot.state = ModelState.LOADING
        started = time.monotonic()
        spec = LoadSpec(
            engine_dir=str(slot.engine.folder.resolve()),
            kv_cache_bytes=self._kv_bytes(slot),
            device=self._config.worker.device,
            threads=self._config.worker.threads,
            capacity_policy=self._config.worker.capacity_policy,
        )
        worker = WorkerClient(slot.name, await self.pool.take(), on_exit=self._on_worker_exit)
        try:
            ready = await worker.start(spec, self._config.worker.load_timeout_s)
        except InfernoError as exc:
            self._fail(slot, exc.message, load=True)
            self._refill_spare_when_idle()
            if isinstance(exc, ModelUnavailable):
                raise
            raise ModelUnavailable(f"model '{slot.name}' failed to load: {exc.message}") from exc
        self.ledger.commit(slot.name, ready.pid, fallback=ready.rss_bytes, device_bytes=ready.device_bytes)
        slot.worker, slot.state, slot.last_error = worker, ModelState.READY, None
        slot.loads += 1
        if self._refill_after_load:
            self.pool.refill()
        seconds = time.monotonic() - started
        self._events.model_loaded(slot.name, seconds)
        log.info("model %s loaded in %.2f s on %s (pid %d)", slot.name, seconds, ready.device, ready.pid)
        if slot.idle:
            self._on_idle(slot)

    async def _make_room(self, slot: ModelSlot, need: int) -> None:
        """Reserve `need` bytes for the slot, evicting idle models or waiting for busy ones to go idle."""
        deadline = time.monotonic() + self._config.scheduling.queue_timeout_s
        while True:
            async with self._placement:
                plan = policy.plan_load(need, self.ledger.free(), self.ledger.usable, self._residents())
                if plan.placement is Placement.LOAD:
                    self.ledger.reserve_for(slot.name, need)
                    slot.state = ModelState.LOADING
                    return
                if plan.placement is Placement.EVICT:
                    log.info("evicting %s to load %s", ", ".join(plan.evict), slot.name)
                    await asyncio.gather(*(self._unload(self.slots[n], "evicted") for n in plan.evict))
                    continue
                capacity = self._capacity
            remaining = deadline - time.monotonic()
            if plan.placement is not Placement.WAIT or remaining <= 0:
                raise ModelUnavailable(
                    f"model '{slot.name}' cannot be loaded now: {plan.reason}",
                    retry_after_s=None if plan.placement is Placement.IMPOSSIBLE else RETRY_AFTER_BUSY_S,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(capacity.wait(), remaining)

    def _start_unload(self, slot: ModelSlot, reason: str) -> asyncio.Task:
        if slot.unload_task is None or slot.unload_task.done():
            slot.unload_task = asyncio.create_task(self._unload(slot, reason), name=f"unload-{slot.name}")
        return slot.unload_task

    async def _unload(self, slot: ModelSlot, reason: str) -> None:
        worker = slot.worker
        if worker is None or slot.state is ModelState.UNLOADING:
            return
        slot.cancel_idle_timer()
        slot.state = ModelState.UNLOADING
        await worker.stop(self._config.worker.stop_timeout_s)
        freed = self.ledger.footprint(slot.name)
        self.ledger.release(slot.name)
        slot.worker, slot.state = None, ModelState.UNLOADED
        if reason == "evicted":
            slot.evictions += 1
        returned = self.ledger.returned(worker.pid)
        log.info(
            "model %s unloaded (%s): worker %d exited, %.0f MiB %s",
            slot.name, reason, worker.pid, freed / 2**20, "returned" if returned else "NOT yet returned",
        )
        self._events.model_unloaded(slot.name, reason)
        self._notify_capacity()

    def _fail(self, slot: ModelSlot, message: str, load: bool) -> None:
        self.ledger.release(slot.name)
        slot.state, slot.worker, slot.last_error = ModelState.FAILED, None, message
        slot.consecutive_failures += 1
        slot.retry_at = time.monotonic() + policy.backoff_s(slot.consecutive_failures)
        if load:
            slot.load_failures += 1
            log.error("model %s failed to load: %s", slot.name, message)
        self._notify_capacity()

    def _on_worker_exit(self, model: str) -> None:
        slot = self.slots[model]
        if slot.state is ModelState.READY:  # not an unload we asked for: a crash; the next request reloads
            slot.crashes += 1
            self._fail(slot, "the worker process exited unexpectedly", load=False)
            self._events.worker_crashed(model)

    # -- by hand (the admin API) ------------------------------------------------------------------------
    async def load(self, model: str) -> ModelSnapshot:
        slot = self.slot_for(model)
        if self._draining:
            raise ShuttingDown("the server is shutting down")
        slot.retry_at = 0.0  # an operator asking is the retry
        await self._ensure_loaded(slot)
        return slot.snapshot(self.ledger.footprint(model))

    async def unload(self, model: str) -> ModelSnapshot:
        slot = self.slot_for(model)
        if slot.pinned:
            raise ModelUnavailable(f"model '{model}' is pinned: unpin it before unloading it")
        if slot.running or slot.waiters:
            raise ModelUnavailable(
                f"model '{model}' is serving {slot.running} requests ({slot.queued} queued); unload it when idle",
                retry_after_s=RETRY_AFTER_BUSY_S,
            )
        if slot.load_task is not None and not slot.load_task.done():
            await asyncio.shield(slot.load_task)
        await self._start_unload(slot, "admin")
        return slot.snapshot(0)

    async def pin(self, model: str, pinned: bool) -> ModelSnapshot:
        """Pinning keeps a model loaded (loading it now if needed); unpinning lets it be evicted again."""
        slot = self.slot_for(model)
        was_pinned, slot.pinned = slot.pinned, pinned
        if pinned:
            slot.cancel_idle_timer()
            try:
                await self.load(model)
            except InfernoError:
                slot.pinned = was_pinned
                raise
        elif slot.idle:
            self._on_idle(slot)
        return slot.snapshot(self.ledger.footprint(model))
