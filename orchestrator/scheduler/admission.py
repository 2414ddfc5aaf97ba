"""Admission: the permits and the bounded queues in front of them. A request runs now, waits its
turn, or is turned away; when a permit frees, `policy.pick_next` says whose turn it is.

Admission knows nothing of workers or memory: it tells its owner when a model goes idle and when the server
as a whole turns busy or quiet, through the callbacks it is given.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from orchestrator.config import SchedulingConfig
from orchestrator.errors import ModelUnavailable, QueueFull, ShuttingDown
from orchestrator.scheduler import policy
from orchestrator.scheduler.entries import ModelEntry, Waiter
from orchestrator.scheduler.policy import Admission
from orchestrator.scheduler.settings import Priority

RETRY_AFTER_BUSY_S = 5.0  # Retry-After for a request turned away because models stayed busy
RETRY_AFTER_QUEUE_FULL_S = 1.0
RETRY_AFTER_SHUTDOWN_S = 5.0  # another replica may serve it meanwhile


class AdmissionControl:
    def __init__(
        self,
        entries: dict[str, ModelEntry],
        scheduling: SchedulingConfig,
        on_model_idle: Callable[[ModelEntry], None],
        on_busy: Callable[[], None],
        on_quiet: Callable[[], None],
    ):
        """on_model_idle: a loaded model has nothing running or queued; on_busy: a request took a
        permit; on_quiet: no request holds a permit any more."""
        self._entries = entries
        self._scheduling = scheduling
        self._on_model_idle = on_model_idle
        self._on_busy = on_busy
        self._on_quiet = on_quiet
        self._arrivals = itertools.count()
        self.draining = False
        self.quiet = asyncio.Event()  # set while no request holds a permit
        self.quiet.set()

    def total_running(self) -> int:
        return sum(s.running for s in self._entries.values())

    async def acquire(self, entry: ModelEntry, priority: Priority) -> None:
        """Take a permit on the entry's model, waiting in its queue if need be.

        Raises ShuttingDown while draining, QueueFull when the model's queue is full, and ModelUnavailable
        when no permit frees within the queue timeout. Every successful acquire is paired with one `release`.
        """
        if self.draining:
            raise ShuttingDown("the server is shutting down and takes no new requests",
                               retry_after_s=RETRY_AFTER_SHUTDOWN_S)
        entry.cancel_idle_timer()
        decision = policy.admit(entry.load_view(), self.total_running(), self._scheduling.max_running_total)
        if decision is Admission.RUN:
            self._take(entry)
            return
        if decision is Admission.REJECT:
            raise QueueFull(
                f"model '{entry.name}' has {entry.queued} requests queued (the limit is {entry.max_queue}); retry shortly",
                retry_after_s=RETRY_AFTER_QUEUE_FULL_S,
            )
        await self._wait(entry, priority)

    async def _wait(self, entry: ModelEntry, priority: Priority) -> None:
        """Wait in the queue until granted a permit (by `_dispatch`), refused (timeout, drain) or cancelled.

        Granting and expiring both settle the one future, so only the first counts. A request cancelled
        after it was granted, before it could run, passes its permit on."""
        waiter = Waiter.make(priority, next(self._arrivals))
        entry.enqueue(waiter)
        expiry = asyncio.get_running_loop().call_later(self._scheduling.queue_timeout_s, self._expire, entry, waiter)
        try:
            await waiter.future
        except BaseException:
            if waiter in entry.waiters:
                entry.waiters.remove(waiter)
            if waiter.granted:
                self.release(entry)
            raise
        finally:
            expiry.cancel()

    def _expire(self, entry: ModelEntry, waiter: Waiter) -> None:
        if not waiter.future.done():
            timeout = self._scheduling.queue_timeout_s
            waiter.future.set_exception(
                ModelUnavailable(
                    f"model '{entry.name}' stayed busy for {timeout:.0f} s; retry later", retry_after_s=RETRY_AFTER_BUSY_S
                )
            )

    def release(self, entry: ModelEntry) -> None:
        """Give back a permit: hand free permits to waiters, then report idleness."""
        entry.running -= 1
        self._dispatch()
        if entry.idle:
            self._on_model_idle(entry)
        if self.total_running() == 0:
            self.quiet.set()
            self._on_quiet()

    def _take(self, entry: ModelEntry) -> None:
        entry.running += 1
        self.quiet.clear()
        self._on_busy()

    def _dispatch(self) -> None:
        """Hand free permits to waiters, in the order the policy picks."""
        limit = self._scheduling.max_running_total
        while True:
            views = [s.load_view() for s in self._entries.values() if s.waiters]
            name = policy.pick_next(views, self.total_running(), limit)
            if name is None:
                return
            entry = self._entries[name]
            waiter = entry.waiters.pop(0)
            if not waiter.future.done():
                self._take(entry)
                waiter.future.set_result(True)

    def drain(self) -> None:
        """From now on new requests are refused, and queued ones are turned away; running ones go on."""
        self.draining = True
        for entry in self._entries.values():
            for waiter in entry.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        ShuttingDown("the server is shutting down", retry_after_s=RETRY_AFTER_SHUTDOWN_S))
            entry.waiters.clear()

    async def wait_quiet(self, timeout_s: float) -> bool:
        """Wait until no request holds a permit; False if some still do after timeout_s."""
        try:
            await asyncio.wait_for(self.quiet.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
