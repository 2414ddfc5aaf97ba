"""Recovering from failures: a model whose worker crashed or whose load failed, and its backoff.

A model whose worker crashed is `unloaded` at once (the next request loads it) unless crashes in a row call
for a backoff, during which it is `failed` and requests get 503 with Retry-After; when the backoff is over it
is `unloaded` again. A model whose load failed stays `failed` until the next attempt. A pinned model is loaded
again by itself as soon as its backoff allows, retrying with the same backoff. The backoff itself is
`policy.backoff_s`; loading is placement.py's, which this module is given as `reload`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from orchestrator.errors import InfernoError, ModelUnavailable
from orchestrator.scheduler import policy
from orchestrator.scheduler.entries import ModelEntry, ModelState
from orchestrator.scheduler.ledger import MemoryLedger
from orchestrator.scheduler.observe import SchedulerEvents

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, entries: dict[str, ModelEntry], ledger: MemoryLedger, events: SchedulerEvents,
                 clock: Callable[[], float], reload: Callable[[ModelEntry], Awaitable[object]],
                 capacity_changed: Callable[[], None]):
        """`reload(entry)` loads a model (placement's ensure_loaded); `capacity_changed()` wakes loads waiting
        for room."""
        self._entries = entries
        self._ledger = ledger
        self._events = events
        self._clock = clock
        self._load = reload
        self._capacity_changed = capacity_changed
        self._reloading = True  # pinned models are loaded again after failures (not once the server drains)
        self._reloads: set[asyncio.Task] = set()

    def check_backoff(self, entry: ModelEntry) -> None:
        """Raise ModelUnavailable (with Retry-After) while a failing model waits for its next attempt."""
        wait = entry.retry_in(self._clock())
        if entry.state is ModelState.FAILED and wait > 0:
            raise ModelUnavailable(
                f"model '{entry.name}' is failing ({entry.last_error}); the next attempt is in {wait:.0f} s",
                retry_after_s=wait,
            )

    def retry_after_s(self, entry: ModelEntry) -> float:
        """What a request that failed with the model (its worker crashed, its load failed) should wait before
        trying again: the backoff's rest, and at least a second (the reload takes that, at least)."""
        return max(1.0, entry.retry_in(self._clock()))

    def failed(self, entry: ModelEntry, message: str, load: bool) -> None:
        """A failed load (the model is `failed` until its next attempt) or a crash (`unloaded`, or `failed`
        while crashes in a row back off); a pinned model's reload is scheduled for when the backoff ends."""
        self._ledger.release(entry.name)
        entry.worker, entry.last_error = None, message
        entry.consecutive_failures += 1
        backoff = policy.backoff_s(entry.consecutive_failures)
        entry.retry_at = self._clock() + backoff
        entry.state = ModelState.FAILED if load or backoff > 0 else ModelState.UNLOADED
        if load:
            entry.load_failures += 1
            log.error("model %s failed to load: %s", entry.name, message)
        entry.cancel_retry_timer()
        if backoff > 0 or entry.pinned:
            entry.retry_timer = asyncio.get_running_loop().call_later(backoff, self._backoff_over, entry, load)
        self._capacity_changed()

    def _backoff_over(self, entry: ModelEntry, load_failed: bool) -> None:
        entry.retry_at = 0.0  # over, even if the loop's timer fired a hair before the deadline
        if entry.state is ModelState.FAILED and not load_failed:
            entry.state = ModelState.UNLOADED  # crashed: the next request loads it
        if entry.pinned and self._reloading and entry.state in (ModelState.FAILED, ModelState.UNLOADED):
            task = asyncio.create_task(self._reload(entry), name=f"reload-{entry.name}")
            self._reloads.add(task)
            task.add_done_callback(self._reloads.discard)

    async def _reload(self, entry: ModelEntry) -> None:
        """A pinned model, loaded again after a failure; a failure here schedules the next try."""
        log.info("reloading pinned model %s after: %s", entry.name, entry.last_error)
        with contextlib.suppress(InfernoError):
            await self._load(entry)

    def stop_reloading(self) -> None:
        """The server drains: no more reloads of pinned models."""
        self._reloading = False
        for entry in self._entries.values():
            entry.cancel_retry_timer()

    def worker_exited(self, model: str) -> None:
        """The WorkerHandle's exit callback: an exit nobody asked for is a crash."""
        entry = self._entries[model]
        if entry.state is ModelState.READY:  # not an unload we asked for: a crash; the next request reloads
            entry.crashes += 1
            self.failed(entry, "the worker process exited unexpectedly", load=False)
            self._events.worker_crashed(model)
