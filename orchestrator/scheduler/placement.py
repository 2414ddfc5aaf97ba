"""Placement and model lifecycle: which models are loaded on the device, and the moves between states.

One load per model, shared by every request waiting for it; room made by evicting idle models (least
recently used first) or by waiting for busy ones to go idle, as `policy.plan_load` decides; unloads
(evicted, idle past keep-alive, by hand, at shutdown). Crashes and failed loads, with their backoff, are
recovery.py's. Workers come from the `WorkerSource` it is given; it never starts a process itself.

An unloaded model's weights are kept in host RAM (the `WeightKeeper` it is given) where `policy.plan_keep` allows,
once the load that evicted it has its room; they are the first thing a load drops, and the model's own next load
uses them (its load message says so: `LoadSpec.weights_kept`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from orchestrator.backends.options import options_for, prompt_cache_budget
from orchestrator.config import ServerConfig
from orchestrator.engine.manifest import weight_files
from orchestrator.errors import InfernoError, ModelUnavailable
from orchestrator.ipc.messages import LoadSpec
from orchestrator.scheduler import policy
from orchestrator.scheduler.admission import RETRY_AFTER_BUSY_S
from orchestrator.scheduler.entries import ModelEntry, ModelState
from orchestrator.scheduler.ledger import MemoryLedger
from orchestrator.scheduler.observe import SchedulerEvents
from orchestrator.scheduler.policy import KeptWeights, LoadPlan, Memory, Placement, Resident
from orchestrator.scheduler.recovery import Recovery
from orchestrator.supervisor.handle import WorkerHandle, WorkerSource
from orchestrator.supervisor.keeper import WeightKeeper

log = logging.getLogger(__name__)


def _retrieve(task: asyncio.Task) -> None:
    """A load's outcome, once it is done: waiters that gave up no longer look, and asyncio would complain."""
    if not task.cancelled():
        task.exception()


class ModelPlacement:
    def __init__(self, entries: dict[str, ModelEntry], config: ServerConfig, ledger: MemoryLedger,
                 workers: WorkerSource, events: SchedulerEvents, clock: Callable[[], float],
                 keeper: WeightKeeper):
        self._entries = entries
        self._keeper = keeper
        self._keeping = True  # False once the server stops: nothing more is kept
        self._tasks: set[asyncio.Task] = set()  # keeps and drops running in the background
        self._config = config
        self._ledger = ledger
        self._workers = workers
        self._events = events
        self._clock = clock
        self._planning = asyncio.Lock()  # one placement plan (and its evictions) at a time
        self._capacity = asyncio.Event()  # replaced on every notify: waiters hold the one they saw
        self.recovery = Recovery(entries, ledger, events, clock, self.ensure_loaded, self._notify_capacity)

    async def preload(self, fit_others: bool) -> None:
        """Load pinned models, then (fit_others) every other model that fits without evicting. A model
        that fails to load is left failed; the next request for it tries again."""
        for entry in [s for s in self._entries.values() if s.pinned]:
            with contextlib.suppress(InfernoError):
                await self.ensure_loaded(entry)
        if not fit_others:
            return
        for entry in [s for s in self._entries.values() if not s.pinned]:
            if self._ledger.room().covers(self.need(entry)):
                with contextlib.suppress(InfernoError):
                    await self.ensure_loaded(entry)

    def estimate(self, entry: ModelEntry) -> int:
        manifest = entry.engine.manifest
        return self._ledger.estimate(
            entry.name, manifest.weights_bytes, self._kv_bytes(entry), self._config.memory.overhead_bytes
        )

    def _kv_bytes(self, entry: ModelEntry) -> int:
        return entry.settings.kv_cache_bytes or entry.engine.manifest.kv_cache.default_budget_bytes

    def host_tier_bytes(self, entry: ModelEntry) -> int:
        """The host RAM the model's prompt cache takes (its host KV tier), 0 for backends without one."""
        backend = entry.engine.manifest.backend
        return prompt_cache_budget(backend, entry.settings.prompt_cache_bytes, self._kv_bytes(entry))

    def host_bytes(self, entry: ModelEntry) -> int:
        """The pinned host RAM the model holds while loaded: its host KV tier and its generation logits pool."""
        pool = entry.engine.logits_pool
        return self.host_tier_bytes(entry) + (pool.pool_bytes if pool is not None else 0)

    def need(self, entry: ModelEntry) -> Memory:
        """What loading the model takes: its device estimate, and its host tier and logits pool in pinned host
        RAM."""
        return self._ledger.need(self.estimate(entry), self.host_bytes(entry))

    # -- loading ------------------------------------------------------------------------------------------
    async def ensure_loaded(self, entry: ModelEntry, within_s: float | None = None) -> WorkerHandle:
        """The model's worker, loading it first if need be (one load, however many callers wait on it).
        With `within_s`, a caller that would wait longer for the load gets ModelUnavailable with Retry-After
        (the load goes on for the others)."""
        if entry.state is ModelState.READY and entry.worker is not None and entry.worker.alive:
            return entry.worker
        if entry.load_task is None or entry.load_task.done():
            entry.load_task = asyncio.create_task(self._load(entry), name=f"load-{entry.name}")
            entry.load_task.add_done_callback(_retrieve)  # its failure is told to whoever still waits
        try:
            await asyncio.wait_for(asyncio.shield(entry.load_task), within_s)
        except TimeoutError:
            waited = self._config.scheduling.queue_timeout_s
            why = f"cannot be loaded now: {entry.waiting_for_room}" if entry.waiting_for_room else "is still loading"
            raise ModelUnavailable(
                f"model '{entry.name}' {why} (waited {waited:.0f} s); retry shortly", retry_after_s=RETRY_AFTER_BUSY_S
            ) from None
        return entry.worker

    async def _load(self, entry: ModelEntry) -> None:
        if entry.unload_task is not None and not entry.unload_task.done():
            await entry.unload_task  # an eviction of this model is finishing: load it afresh after
        self.recovery.check_backoff(entry)
        entry.cancel_retry_timer()  # this is the retry
        weights_kept = await self._make_room(entry, self.estimate(entry), self.host_bytes(entry))
        entry.state = ModelState.LOADING
        started = self._clock()
        worker = await self._workers.take(entry.name, self.recovery.worker_exited)
        try:
            ready = await worker.start(self._load_spec(entry, weights_kept), self._config.worker.load_timeout_s)
        except InfernoError as exc:
            self.recovery.failed(entry, exc.message, load=True)
            self._workers.load_finished(succeeded=False)
            if not isinstance(exc, ModelUnavailable):
                exc = ModelUnavailable(f"model '{entry.name}' failed to load: {exc.message}")
            if exc.retry_after_s is None:
                exc.retry_after_s = self.recovery.retry_after_s(entry)
            raise exc
        finally:
            self._background(self._keeper.drop(entry.name), f"unkeep-{entry.name}")  # the load has its pages now
        self._ledger.commit(entry.name, ready.pid, fallback=ready.rss_bytes, device_bytes=ready.load.device_bytes)
        entry.worker, entry.state, entry.last_error = worker, ModelState.READY, None
        entry.loads += 1
        self._workers.load_finished(succeeded=True)
        seconds = self._clock() - started
        self._events.model_loaded(entry.name, seconds)
        log.info("model %s loaded in %.2f s on %s (pid %d)", entry.name, seconds, ready.load.device, ready.pid)
        if entry.idle:
            self.model_idle(entry)

    def _load_spec(self, entry: ModelEntry, weights_kept: bool) -> LoadSpec:
        """The engine folder, its budget, its backend's option section from the server's worker settings and the
        model's own (generation_logits, its host KV tier, retain_system_prompt), and whether its weights were kept."""
        manifest = entry.engine.manifest
        own = {
            "generation_logits": manifest.generation_logits,  # the model's setting over the manifest's
            "prompt_cache_bytes": self.host_tier_bytes(entry),  # what the ledger holds for it, resolved once
            "retain_system_prompt": entry.settings.retain_system_prompt,
        }
        options = options_for(manifest.backend, {**self._config.worker.model_dump(), **own})
        return LoadSpec(str(entry.engine.folder.resolve()), self._kv_bytes(entry), options, weights_kept)

    async def _make_room(self, entry: ModelEntry, estimate: int, host: int) -> bool:
        """Reserve `estimate` bytes of the device and `host` of pinned host RAM for the entry, dropping kept weights,
        evicting idle models or waiting for busy ones to go idle (within the queue timeout); raises ModelUnavailable
        when it cannot. True when the model's own weights were kept (its load uses them)."""
        need = self._ledger.need(estimate, host)
        deadline = self._clock() + self._config.scheduling.queue_timeout_s
        while True:
            async with self._planning:  # held until the room made is reserved: no other load takes it
                plan = self._plan(entry, need)
                while plan.drop or plan.placement is Placement.EVICT:
                    await self._drop_kept(plan.drop, f"to load {entry.name}")
                    if plan.placement is Placement.EVICT:
                        log.info("evicting %s to load %s", ", ".join(plan.evict), entry.name)
                        # Each victim stops taking requests now, in this turn of the loop, as the plan saw it idle.
                        await asyncio.gather(*(self.start_unload(self._entries[n], "evicted") for n in plan.evict))
                    plan = self._plan(entry, need)
                if plan.placement is Placement.LOAD:
                    weights_kept = self._ledger.reserve_for(entry.name, estimate, host)
                    entry.state = ModelState.LOADING
                    return weights_kept
                capacity = self._capacity
            remaining = deadline - self._clock()
            if plan.placement is not Placement.WAIT or remaining <= 0:
                raise ModelUnavailable(
                    f"model '{entry.name}' cannot be loaded now: {plan.reason}",
                    retry_after_s=None if plan.placement is Placement.IMPOSSIBLE else RETRY_AFTER_BUSY_S,
                )
            entry.waiting_for_room = plan.reason
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(capacity.wait(), remaining)
            finally:
                entry.waiting_for_room = None

    def _plan(self, entry: ModelEntry, need: Memory) -> LoadPlan:
        """The plan for the entry's load now; its own kept weights count as room (its load uses them)."""
        own = self._ledger.kept_need(self._ledger.kept_bytes(entry.name))
        return policy.plan_load(need, self._ledger.room() + own, self._ledger.usable_memory(), self._residents(),
                                self._ledger.kept_weights(except_model=entry.name))

    def _residents(self) -> list[Resident]:
        return [
            Resident(s.name, self._ledger.held(s.name), s.pinned, s.idle, s.last_used)
            for s in self._entries.values()
            if s.state in (ModelState.READY, ModelState.LOADING)
        ]

    def _notify_capacity(self) -> None:
        self._capacity.set()
        self._capacity = asyncio.Event()

    # -- idleness and unloading ---------------------------------------------------------------------------
    def model_idle(self, entry: ModelEntry) -> None:
        """A loaded model has nothing running or queued: it may be evicted now, and unloaded after its
        keep-alive."""
        self._notify_capacity()
        delay = policy.idle_unload_delay(entry.settings.keep_alive_s, entry.pinned)
        if delay is None:
            return
        entry.cancel_idle_timer()
        entry.idle_timer = asyncio.get_running_loop().call_later(delay, self._unload_if_idle, entry)

    def _unload_if_idle(self, entry: ModelEntry) -> None:
        if entry.idle and not entry.pinned:
            self.start_unload(entry, "idle")

    def start_unload(self, entry: ModelEntry, reason: str) -> asyncio.Task:
        """Unload in a task of its own (one at a time per model); returns that task. The model stops taking
        requests at once (UNLOADING), not when the task first runs, and a load of it waits for the task."""
        if entry.unload_task is None or entry.unload_task.done():
            worker = self._begin_unload(entry)
            entry.unload_task = asyncio.create_task(self._finish_unload(entry, worker, reason),
                                                   name=f"unload-{entry.name}")
        return entry.unload_task

    async def unload(self, entry: ModelEntry, reason: str) -> None:
        """Stop the model's worker and return its memory; reason: evicted | idle | admin | shutdown."""
        await self._finish_unload(entry, self._begin_unload(entry), reason)

    def _begin_unload(self, entry: ModelEntry) -> WorkerHandle | None:
        """The worker to stop (None when there is none, or another unload has it): from here on the model
        takes no requests."""
        worker = entry.worker
        if worker is None or entry.state is ModelState.UNLOADING:
            return None
        entry.cancel_idle_timer()
        entry.state = ModelState.UNLOADING
        return worker

    async def _finish_unload(self, entry: ModelEntry, worker: WorkerHandle | None, reason: str) -> None:
        if worker is None:
            return
        spare = await self._workers.retire(worker, self._config.worker.stop_timeout_s, reuse=reason != "shutdown")
        freed = self._ledger.footprint(entry.name)
        self._ledger.release(entry.name, spare_pid=worker.pid if spare else None)
        entry.worker, entry.state = None, ModelState.UNLOADED
        if reason == "evicted":
            entry.evictions += 1
        returned = spare or self._ledger.returned(worker.pid)
        log.info(
            "model %s unloaded (%s): worker %d %s, %.0f MiB %s", entry.name, reason, worker.pid,
            "the spare now" if spare else "exited", freed / 2**20, "returned" if returned else "NOT yet returned",
        )
        self._events.model_unloaded(entry.name, reason)
        self._notify_capacity()
        if reason != "shutdown":
            self._background(self._keep(entry), f"keep-{entry.name}")

    async def unload_all(self, reason: str) -> None:
        for entry in self._entries.values():
            entry.cancel_idle_timer()
        await asyncio.gather(*(self.unload(entry, reason) for entry in self._entries.values()))

    # -- kept weights -------------------------------------------------------------------------------------
    async def _keep(self, entry: ModelEntry) -> None:
        """Keep an unloaded model's weights in host RAM where `policy.plan_keep` allows. It waits for the planning
        lock, so the weights of a model evicted for a load are weighed once that load has reserved its room."""
        manifest = entry.engine.manifest
        files = [entry.engine.folder / name for name in weight_files(manifest)]
        async with self._planning:
            if (not self._keeping or not self._ledger.kept_budget or entry.state is not ModelState.UNLOADED
                    or self._ledger.kept_bytes(entry.name)):
                return
            try:  # a sim engine has no weight files: its simulated weights are counted
                nbytes = sum(path.stat().st_size for path in files) if files else manifest.weights_bytes
            except OSError as exc:
                log.warning("the weights of %s are not kept: %s", entry.name, exc)
                return
            weights = KeptWeights(entry.name, self._ledger.kept_need(nbytes), entry.last_used)
            plan = policy.plan_keep(weights, self._ledger.kept_budget, self._ledger.kept_weights(), self._ledger.room())
            if not plan.keep:
                log.info("the weights of %s are not kept: %s", entry.name, plan.reason)
                return
            await self._drop_kept(plan.drop, f"to keep those of {entry.name}")
            try:
                self._keeper.keep(entry.name, files)
            except OSError as exc:
                log.warning("the weights of %s are not kept: %s", entry.name, exc)
                return
            self._ledger.keep(entry.name, nbytes, entry.last_used)
            log.info("keeping the weights of %s in host RAM (%.0f MiB)", entry.name, nbytes / 2**20)

    async def _drop_kept(self, names: tuple[str, ...], why: str) -> None:
        for name in names:
            if self._ledger.drop(name):
                log.info("dropped the kept weights of %s %s", name, why)
        await asyncio.gather(*(self._keeper.drop(name) for name in names))

    def _background(self, work, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drop_all_kept(self) -> None:
        """At shutdown: keep nothing more, and let go of what is kept."""
        self._keeping = False
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._drop_kept(tuple(name for name in self._entries if self._ledger.kept_bytes(name)), "at shutdown")
        await self._keeper.close()
