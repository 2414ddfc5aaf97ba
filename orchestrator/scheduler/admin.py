"""Loading, unloading and pinning models by hand (the admin API), under the rules requests follow: a load
makes room the same way, an unload refuses a busy or pinned model, nothing new starts while draining."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from orchestrator.errors import InfernoError, ModelUnavailable, ShuttingDown
from orchestrator.scheduler.admission import RETRY_AFTER_BUSY_S, AdmissionControl
from orchestrator.scheduler.entries import ModelEntry
from orchestrator.scheduler.ledger import MemoryLedger
from orchestrator.scheduler.observe import ModelSnapshot
from orchestrator.scheduler.placement import ModelPlacement


class AdminOperations:
    def __init__(self, entry_for: Callable[[str], ModelEntry], admission: AdmissionControl,
                 placement: ModelPlacement, ledger: MemoryLedger, clock: Callable[[], float]):
        self._entry_for = entry_for
        self._admission = admission
        self._placement = placement
        self._ledger = ledger
        self._clock = clock

    def _snapshot(self, entry: ModelEntry) -> ModelSnapshot:
        return entry.snapshot(self._ledger.footprint(entry.name), self._clock())

    async def load(self, model: str) -> ModelSnapshot:
        """Load now (an operator asking is the retry: a failing model's backoff is waived)."""
        entry = self._entry_for(model)
        if self._admission.draining:
            raise ShuttingDown("the server is shutting down")
        entry.retry_at = 0.0
        await self._placement.ensure_loaded(entry)
        return self._snapshot(entry)

    async def unload(self, model: str) -> ModelSnapshot:
        """Unload an idle, unpinned model (waiting for a load in progress to finish first)."""
        entry = self._entry_for(model)
        if entry.pinned:
            raise ModelUnavailable(f"model '{model}' is pinned: unpin it before unloading it")
        if entry.running or entry.waiters:
            raise ModelUnavailable(
                f"model '{model}' is serving {entry.running} requests ({entry.queued} queued); unload it when idle",
                retry_after_s=RETRY_AFTER_BUSY_S,
            )
        if entry.load_task is not None and not entry.load_task.done():
            await asyncio.shield(entry.load_task)
        await self._placement.start_unload(entry, "admin")
        return entry.snapshot(0, self._clock())

    async def pin(self, model: str, pinned: bool) -> ModelSnapshot:
        """Pinning keeps a model loaded (loading it now if needed); unpinning lets it be evicted again."""
        entry = self._entry_for(model)
        was_pinned, entry.pinned = entry.pinned, pinned
        if pinned:
            entry.cancel_idle_timer()
            try:
                await self.load(model)
            except InfernoError:
                entry.pinned = was_pinned
                raise
        elif entry.idle:
            self._placement.model_idle(entry)
        return self._snapshot(entry)
