"""Admission and model placement: which requests run now, which wait, which are turned away, and which
models are loaded.

The request path holds a *lease* while its engine requests run:

    async with scheduler.lease(request) as worker:
        worker.submit(...)

Entering waits for a running slot (bounded queue, timeout) and for the model's worker to be loaded;
leaving cancels whatever is unfinished in the engine and hands the slot to the next waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from orchestrator.config import ServerConfig
from orchestrator.errors import InfernoError, ModelNotFound, ModelUnavailable, QueueFull, ShuttingDown
from orchestrator.lifecycle import InferenceRequest
from orchestrator.scheduler.observe import DeviceMemory, ModelSnapshot, NoEvents, SchedulerEvents
from orchestrator.scheduler.registry import Catalogue
from orchestrator.scheduler.slots import ModelSlot, ModelState, Waiter
from orchestrator.worker.client import WorkerClient
from orchestrator.worker.main import WorkerSpec

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: ServerConfig, catalogue: Catalogue, events: SchedulerEvents | None = None):
        self._config = config
        self._catalogue = catalogue
        self._events = events or NoEvents()
        self.slots: dict[str, ModelSlot] = {
            name: ModelSlot(
                engine=engine,
                max_concurrency=min(config.scheduling.max_concurrency, engine.manifest.limits.max_batch_size),
                max_queue=config.scheduling.max_queue,
            )
            for name, engine in catalogue.engines.items()
        }
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model, one at a time; a model that fails to load is reported, not fatal."""
        for slot in self.slots.values():
            with contextlib.suppress(ModelUnavailable):  # logged, and kept on the slot for /ready and requests
                await self._ensure_loaded(slot)

    @property
    def ready(self) -> bool:
        return bool(self.slots) and all(s.state is ModelState.READY for s in self.slots.values())

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
        await asyncio.gather(*(self._unload(slot) for slot in self.slots.values()))

    def snapshot(self) -> list[ModelSnapshot]:
        return [slot.snapshot() for slot in self.slots.values()]

    def device_memory(self) -> list[DeviceMemory]:
        return []

    # -- the request path ---------------------------------------------------------------------------------
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

    @contextlib.asynccontextmanager
    async def lease(self, request: InferenceRequest) -> AsyncIterator[WorkerClient]:
        slot = self.slot_for(request.model)
        await self._acquire(slot, priority=0)
        worker = None
        try:
            worker = await self._ensure_loaded(slot)
            request.start()
            yield worker
        finally:
            if worker is not None:
                for engine_id in request.unfinished_engine_ids():
                    worker.cancel(engine_id)
            slot.last_used = time.monotonic()
            self._release(slot)

    async def _acquire(self, slot: ModelSlot, priority: int) -> None:
        if self._draining:
            raise ShuttingDown("the server is shutting down and takes no new requests")
        if slot.running < slot.max_concurrency and not slot.waiters:
            self._take(slot)
            return
        if slot.queued >= slot.max_queue:
            raise QueueFull(
                f"model '{slot.name}' has {slot.queued} requests queued (the limit is {slot.max_queue}); retry shortly",
                retry_after_s=1.0,
            )
        waiter = Waiter(priority, time.monotonic(), asyncio.get_running_loop().create_future())
        slot.waiters.append(waiter)
        timeout = self._config.scheduling.queue_timeout_s
        try:
            await asyncio.wait_for(waiter.future, timeout)
        except BaseException as exc:
            if waiter in slot.waiters:
                slot.waiters.remove(waiter)
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self._release(slot)  # the slot was handed over just as we gave up: pass it on
            if isinstance(exc, asyncio.TimeoutError):
                raise ModelUnavailable(
                    f"model '{slot.name}' stayed busy for {timeout:.0f} s; retry later", retry_after_s=5.0
                ) from None
            raise

    def _take(self, slot: ModelSlot) -> None:
        slot.running += 1
        self._idle.clear()

    def _release(self, slot: ModelSlot) -> None:
        slot.running -= 1
        while slot.waiters and slot.running < slot.max_concurrency:
            waiter = slot.waiters.popleft()
            if not waiter.future.done():
                self._take(slot)
                waiter.future.set_result(True)
        if all(s.running == 0 for s in self.slots.values()):
            self._idle.set()

    # -- loading ------------------------------------------------------------------------------------------
    async def _ensure_loaded(self, slot: ModelSlot) -> WorkerClient:
        if slot.state is ModelState.READY and slot.worker is not None and slot.worker.alive:
            return slot.worker
        if slot.load_task is None or slot.load_task.done():
            slot.load_task = asyncio.create_task(self._load(slot), name=f"load-{slot.name}")
        await asyncio.shield(slot.load_task)
        return slot.worker

    async def _load(self, slot: ModelSlot) -> None:
        slot.state = ModelState.LOADING
        engine = slot.engine
        worker_config = self._config.worker
        kv_bytes = worker_config.kv_cache_bytes or engine.manifest.kv_cache.default_budget_bytes

        def spec(fd: int) -> WorkerSpec:
            return WorkerSpec(
                engine_dir=str(engine.folder.resolve()),
                fd=fd,
                kv_cache_bytes=kv_bytes,
                device=worker_config.device,
                threads=worker_config.threads,
                log_level=self._config.log_level,
            )

        worker = WorkerClient(slot.name, spec, on_exit=self._on_worker_exit)
        started = time.monotonic()
        try:
            ready = await worker.start(worker_config.load_timeout_s)
        except InfernoError as exc:
            slot.state, slot.last_error = ModelState.FAILED, exc.message
            slot.load_failures += 1
            log.error("model %s failed to load: %s", slot.name, exc.message)
            if isinstance(exc, ModelUnavailable):
                raise
            raise ModelUnavailable(f"model '{slot.name}' failed to load: {exc.message}") from exc
        slot.worker, slot.state, slot.last_error = worker, ModelState.READY, None
        slot.loads += 1
        slot.memory_bytes = ready.rss_bytes
        self._events.model_loaded(slot.name, time.monotonic() - started)
        log.info(
            "model %s loaded in %.2f s on %s (pid %d, KV cache %d blocks)",
            slot.name, time.monotonic() - started, ready.device, ready.pid, ready.kv_blocks,
        )

    async def _unload(self, slot: ModelSlot) -> None:
        worker = slot.worker
        if worker is None:
            return
        slot.state = ModelState.UNLOADING
        await worker.stop(self._config.worker.stop_timeout_s)
        slot.worker, slot.state, slot.memory_bytes = None, ModelState.UNLOADED, 0
        self._events.model_unloaded(slot.name, "shutdown")

    def _on_worker_exit(self, model: str) -> None:
        slot = self.slots[model]
        if slot.state is ModelState.READY:  # not an unload we asked for: a crash (the next request reloads)
            slot.state, slot.worker, slot.memory_bytes = ModelState.FAILED, None, 0
            slot.last_error = "the worker process exited unexpectedly"
            slot.crashes += 1
            self._events.worker_crashed(model)
