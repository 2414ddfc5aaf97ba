"""The scheduler: which requests run now, which wait, which are turned away, and which models are loaded.

It owns the model table (entries.py) and wires three collaborators around it: `AdmissionControl`
(admission.py: permits and queues), `ModelPlacement` (placement.py: loads, evictions, unloads,
failures) and `AdminOperations` (admin.py: the same by hand). Decisions come from `policy` (pure
functions). Workers come from the `WorkerSource` it is given, so it starts no process itself.

The request path holds a *lease* while its engine requests run:

    async with scheduler.lease(request, priority) as worker:
        worker.submit(...)

Entering waits for a permit (bounded queue, timeout) and for the model's worker to be loaded, which
may evict idle models; leaving cancels whatever is unfinished in the engine and hands the permit on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from orchestrator.backends.protocol import BackendStats
from orchestrator.config import ServerConfig
from orchestrator.engine.catalogue import Catalogue, Engine
from orchestrator.errors import (
    EngineDead,
    ModelNotFound,
    ModelUnavailable,
    ShuttingDown,
    WorkerCrashed,
    without_paths,
)
from orchestrator.lifecycle import InferenceRequest, RequestStatus
from orchestrator.scheduler.admin import AdminOperations
from orchestrator.scheduler.admission import RETRY_AFTER_SHUTDOWN_S, AdmissionControl
from orchestrator.scheduler.entries import ModelEntry, ModelState, build_entries
from orchestrator.scheduler.fairness import ANONYMOUS_TENANT, Tenant
from orchestrator.scheduler.ledger import DeviceProbe, MemoryLedger, detect_probe
from orchestrator.scheduler.observe import (
    DeviceMemory,
    KeptSnapshot,
    ModelSnapshot,
    NoEvents,
    SchedulerEvents,
)
from orchestrator.scheduler.placement import ModelPlacement
from orchestrator.scheduler.settings import ModelSettings, Priority
from orchestrator.scheduler.sim_device import simulated_device
from orchestrator.supervisor.handle import WorkerHandle, WorkerSource
from orchestrator.supervisor.keeper import WeightKeeper

log = logging.getLogger(__name__)

FAREWELL_S = 2.0  # after the drain deadline, how long handlers get to send the requests' errors



@dataclass(frozen=True)
class ModelView:
    """A served model as the HTTP side sees it: its name, its engine (manifest, tokenizer, template) and its
    settings from models.toml. Nothing of its state: that changes under the scheduler's hand."""

    name: str
    engine: Engine
    settings: ModelSettings


@dataclass(frozen=True)
class LedgerState:
    device: str
    capacity_bytes: int
    reserve_bytes: int
    used_bytes: int
    free_bytes: int
    # Pinned host RAM for host KV tiers (0 where the device is the host: the tiers are counted on the device)
    host_capacity_bytes: int
    host_reserve_bytes: int
    host_used_bytes: int
    host_free_bytes: int
    # Unloaded models' weights kept for their next load: what they hold (in host RAM, or on the device where it is
    # the host; counted in the used bytes there too) and their budget
    kept_weights_bytes: int
    kept_weights_budget_bytes: int


class Scheduler:
    """The HTTP side's one way into scheduling: a read-only view of each model (`model`, `model_names`), a lease
    on a loaded model's worker for a request (`lease`), snapshots for metrics and the admin API, the admin
    operations (load, unload, pin) and the server's lifecycle (start, drain, stop). The HTTP side imports
    nothing else of this package (`orchestrator/scheduler/__init__.py` is that list)."""

    def __init__(self, config: ServerConfig, catalogue: Catalogue, workers: WorkerSource,
                 events: SchedulerEvents | None = None, probe: DeviceProbe | None = None,
                 clock: Callable[[], float] = time.monotonic, keeper: WeightKeeper | None = None):
        """`clock`: monotonic seconds, for backoff, deadlines and idle times (tests give their event loop's
        virtual clock). `keeper` holds unloaded models' weights in host RAM (a WeightKeeper of its own by default)."""
        self._config = config
        self._catalogue = catalogue
        self._clock = clock
        self._entries: dict[str, ModelEntry] = build_entries(config, catalogue, clock())
        memory = config.memory
        self._ledger = MemoryLedger(
            probe or simulated_device(catalogue.engines) or detect_probe(config.worker.device, memory.gpu_index),
            memory.capacity_bytes, memory.reserve_bytes, memory.host_capacity_bytes,
            memory.host_reserve_bytes, memory.kept_weights_bytes,
        )
        self._workers = workers
        self._keeper = keeper or WeightKeeper()
        self._placement = ModelPlacement(self._entries, config, self._ledger, workers, events or NoEvents(), clock,
                                         self._keeper)
        self._admission = AdmissionControl(
            self._entries, config.scheduling, on_model_idle=self._placement.model_idle,
            on_busy=workers.server_busy, on_quiet=workers.server_quiet, clock=clock)
        self._admin = AdminOperations(self._entry_for, self._admission, self._placement, self._ledger, clock)
        self._started = False
        self._live: dict[str, tuple[InferenceRequest, WorkerHandle]] = {}  # holding a permit, for the drain

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load pinned models, then (preload=fit) every other model that fits without evicting."""
        await self._placement.preload(fit_others=self._config.scheduling.preload == "fit")
        self._started = True
        self._workers.refill()

    @property
    def ready(self) -> bool:
        """Serving: started, every pinned model loaded, no model that was loaded at start has failed."""
        if not self._started or self._admission.draining or not self._entries:
            return False
        return all(s.state is ModelState.READY for s in self._entries.values() if s.pinned) and not any(
            s.state is ModelState.FAILED and s.loads == 0 and s.load_failures for s in self._entries.values()
        )

    def begin_drain(self) -> None:
        """From now on, new requests get 503 and queued ones are turned away; running ones go on."""
        self._admission.drain()
        self._placement.recovery.stop_reloading()
        self._workers.stop_refilling()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests and let running ones finish for up to `timeout_s`; then end what is still running
        with a ShuttingDown error (a stream gets its error event and [DONE]) and give its handler a moment to
        send it. The workers keep running: `stop` stops them."""
        self.begin_drain()
        if await self._admission.wait_quiet(timeout_s):
            return
        log.warning("drain deadline (%.0f s) reached: ending %d running request(s)", timeout_s, len(self._live))
        error = ShuttingDown("the server is shutting down: the drain deadline ended this request",
                             retry_after_s=RETRY_AFTER_SHUTDOWN_S)
        for request, worker in list(self._live.values()):
            for engine_id in request.unfinished_engine_ids():
                worker.end(engine_id, error)  # its last output, after what its worker wrote to the client
        await self._admission.wait_quiet(FAREWELL_S)

    async def stop(self, drain_timeout_s: float) -> None:
        """Drain (up to drain_timeout_s), then stop every worker."""
        await self.drain(drain_timeout_s)
        await self._placement.unload_all("shutdown")
        await self._placement.drop_all_kept()
        await self._workers.close()

    # -- what the outside sees ----------------------------------------------------------------------------
    def snapshot(self) -> list[ModelSnapshot]:
        now = self._clock()
        return [entry.snapshot(self._ledger.footprint(entry.name), now, self._kept(entry.name))
                for entry in self._entries.values()]

    def _kept(self, model: str) -> KeptSnapshot | None:
        """The model's kept weights: the bytes the ledger counts, and whether the keeper has them pinned."""
        nbytes, files = self._ledger.kept_bytes(model), self._keeper.kept(model)
        return KeptSnapshot(nbytes, files.pinned, files.since) if nbytes and files is not None else None

    def device_memory(self) -> list[DeviceMemory]:
        reading = self._ledger.probe.read()
        return [DeviceMemory(self._ledger.probe.name, self._ledger.capacity, reading.used_bytes, self._ledger.reserve)]

    async def engine_stats(self, timeout_s: float) -> dict[str, BackendStats]:
        """Each loaded model's engine stats; a worker that does not answer within timeout_s is left out."""
        loaded = {n: s.worker for n, s in self._entries.items() if s.state is ModelState.READY and s.worker}
        answers = await asyncio.gather(*(worker.stats(timeout_s) for worker in loaded.values()))
        return {name: stats for name, stats in zip(loaded, answers, strict=True) if stats is not None}

    def model_names(self) -> list[str]:
        """Every model this server serves (loaded or not), in catalogue order."""
        return list(self._entries)

    def model(self, model: str) -> ModelView:
        """What the HTTP side may know of a model before admission: its engine and its settings (read-only).
        Raises ModelNotFound, or ModelUnavailable for an engine folder that was refused."""
        entry = self._entry_for(model)
        return ModelView(entry.name, entry.engine, entry.settings)

    def memory(self) -> LedgerState:
        """The memory ledger's device and numbers now, for the admin API."""
        ledger = self._ledger
        host = (0, 0) if ledger.host_on_device else (ledger.host_capacity, ledger.host_reserve)
        return LedgerState(ledger.probe.name, ledger.capacity, ledger.reserve, ledger.used, ledger.free(), *host,
                           ledger.host_used, ledger.host_free(), ledger.kept_used, ledger.kept_budget)

    @property
    def spare_worker(self) -> str:
        """The spare worker's state (none, starting, warm), for the admin API."""
        return self._workers.spare_state

    @property
    def spare_worker_pid(self) -> int | None:
        """The warm spare's process (an unloaded model's worker, when it was kept), for the admin API."""
        return self._workers.spare_pid

    def _entry_for(self, model: str) -> ModelEntry:
        """The model's entry; raises ModelNotFound, or ModelUnavailable for an engine folder that was refused."""
        entry = self._entries.get(model)
        if entry is not None:
            return entry
        refused = self._catalogue.refused.get(model)
        if refused is not None:
            raise ModelUnavailable(f"model '{model}' cannot be served: {without_paths(refused.reason)}", param="model")
        raise ModelNotFound(
            f"the model '{model}' does not exist; models served here: {', '.join(sorted(self._entries)) or 'none'}",
            param="model",
        )

    # -- the request path ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, request: InferenceRequest, priority: Priority | None = None,
                    tenant: Tenant = ANONYMOUS_TENANT) -> AsyncIterator[WorkerHandle]:
        """A permit on the request's model and its loaded worker, for the duration of the block; `tenant` (the
        caller's key) shares the model fairly with other keys, charged the tokens the request is served.

        Waiting for a permit (and for room in the model's generation logits pool, for a top_logprobs request on a
        model with one) and for the model's load together take at most the queue timeout (then 503 with
        Retry-After). Leaving cancels the request's unfinished engine requests; a request that finished well
        resets the model's failure count (so a later failure is retried at once). A request whose worker
        crashed under it leaves with Retry-After: when the model can be tried again."""
        entry = self._entry_for(request.model)
        self._placement.recovery.check_backoff(entry)
        logits = entry.logits_draw(request)  # its generation logits buffers, drawn from the model's pool
        deadline = self._clock() + self._config.scheduling.queue_timeout_s
        await self._admission.acquire(entry, entry.settings.priority_class if priority is None else priority, tenant,
                                      request, logits)
        worker = None
        try:
            worker = await self._placement.ensure_loaded(entry, within_s=max(0.0, deadline - self._clock()))
            request.start()
            self._live[request.id] = (request, worker)
            yield worker
        except (WorkerCrashed, EngineDead) as exc:
            if exc.retry_after_s is None:
                exc.retry_after_s = self._placement.recovery.retry_after_s(entry)
            raise
        finally:
            self._live.pop(request.id, None)
            if worker is not None:
                for engine_id in request.unfinished_engine_ids():
                    worker.cancel(engine_id)
            if request.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
                entry.consecutive_failures = 0
            entry.last_used = self._clock()
            self._admission.release(entry, tenant, request, logits)

    # -- by hand (the admin API) --------------------------------------------------------------------------
    async def load(self, model: str) -> ModelSnapshot:
        return await self._admin.load(model)

    async def unload(self, model: str) -> ModelSnapshot:
        return await self._admin.unload(model)

    async def pin(self, model: str, pinned: bool) -> ModelSnapshot:
        return await self._admin.pin(model, pinned)
