"""Loading, unloading and pinning models by hand (the admin API), under the rules requests follow: a load
makes room the same way, an unload refuses a busy or pinned model, nothing new starts while draining."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from orchestrator.errors import InfernoError, ModelUnavailable, ShuttingDown
from orchestrator.scheduler.admission import RETRY_AFTER_BUSY_S, AdmissionControl
from orchestrator.scheduler.ledger import MemoryLedger
from orchestrator.scheduler.observe import ModelSnapshot
from orchestrator.scheduler.placement import ModelPlacement
from orchestrator.scheduler.slots import ModelSlot


class AdminOperations:
    def __init__(
        self,
        slot_for: Callable[[str], ModelSlot],
        admission: AdmissionControl,
        placement: ModelPlacement,
        ledger: MemoryLedger,
        clock: Callable[[], float],
    ):
        self._slot_for = slot_for
        self._admission = admission
        self._placement = placement
        self._ledger = ledger
        self._clock = clock

    def _snapshot(self, slot: ModelSlot) -> ModelSnapshot:
        return slot.snapshot(self._ledger.footprint(slot.name), self._clock())

    async def load(self, model: str) -> ModelSnapshot:
        """Load now (an operator asking is the retry: a failing model's backoff is waived)."""
        slot = self._slot_for(model)
        if self._admission.draining:
            raise ShuttingDown("the server is shutting down")
        slot.retry_at = 0.0
        await self._placement.ensure_loaded(slot)
        return self._snapshot(slot)

    async def unload(self, model: str) -> ModelSnapshot:
        """Unload an idle, unpinned model (waiting for a load in progress to finish first)."""
        slot = self._slot_for(model)
        if slot.pinned:
            raise ModelUnavailable(f"model '{model}' is pinned: unpin it before unloading it")
        if slot.running or slot.waiters:
            raise ModelUnavailable(
                f"model '{model}' is serving {slot.running} requests ({slot.queued} queued); unload it when idle",
                retry_after_s=RETRY_AFTER_BUSY_S,
            )
        if slot.load_task is not None and not slot.load_task.done():
            await asyncio.shield(slot.load_task)
        await self._placement.start_unload(slot, "admin")
        return slot.snapshot(0, self._clock())

    async def pin(self, model: str, pinned: bool) -> ModelSnapshot:
        """Pinning keeps a model loaded (loading it now if needed); unpinning lets it be evicted again."""
        slot = self._slot_for(model)
        was_pinned, slot.pinned = slot.pinned, pinned
        if pinned:
            slot.cancel_idle_timer()
            try:
                await self.load(model)
            except InfernoError:
                slot.pinned = was_pinned
                raise
        elif slot.idle:
            self._placement.model_idle(slot)
        return self._snapshot(slot)
