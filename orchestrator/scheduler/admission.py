"""Admission: the permits and the bounded queues in front of them. A request runs now, waits its
turn, or is turned away; when a permit frees, `policy.pick_next` says which model's turn it is and
`policy.pick_key` which API key's on that model (fairness.py keeps what it decides from).

Admission knows nothing of workers or of the memory ledger: it tells its owner when a model goes idle and when the
server as a whole turns busy or quiet, through the callbacks it is given. The one memory it shares out is a model's
generation logits pool (engine/logits.py, held in the ledger while the model is loaded): a top_logprobs request
draws its bytes with its permit and gives them back with it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from orchestrator.config import SchedulingConfig
from orchestrator.errors import ModelUnavailable, QueueFull, ShuttingDown
from orchestrator.scheduler import policy
from orchestrator.scheduler.entries import ModelEntry, Waiter
from orchestrator.scheduler.fairness import ANONYMOUS_TENANT, Metered, Tenant
from orchestrator.scheduler.policy import Admission
from orchestrator.scheduler.settings import Priority

RETRY_AFTER_BUSY_S = 5.0  # Retry-After for a request turned away because models stayed busy
RETRY_AFTER_QUEUE_FULL_S = 1.0
RETRY_AFTER_SHUTDOWN_S = 5.0  # another replica may serve it meanwhile


class AdmissionControl:
    def __init__(self, entries: dict[str, ModelEntry], scheduling: SchedulingConfig,
                 on_model_idle: Callable[[ModelEntry], None], on_busy: Callable[[], None],
                 on_quiet: Callable[[], None], clock: Callable[[], float] = time.monotonic):
        """on_model_idle: a loaded model has nothing running or queued; on_busy: a request took a
        permit; on_quiet: no request holds a permit any more; clock: the scheduler's (monotonic seconds, for how
        recently each key was active)."""
        self._clock = clock
        self._entries = entries
        self._scheduling = scheduling
        self._on_model_idle = on_model_idle
        self._on_busy = on_busy
        self._on_quiet = on_quiet
        self._arrivals = itertools.count()
        self._recheck: asyncio.TimerHandle | None = None  # dispatches again once permits kept for keys free up
        self.draining = False
        self.quiet = asyncio.Event()  # set while no request holds a permit
        self.quiet.set()

    def total_running(self) -> int:
        return sum(s.running for s in self._entries.values())

    async def acquire(self, entry: ModelEntry, priority: Priority, tenant: Tenant = ANONYMOUS_TENANT,
                      request: Metered | None = None, logits_bytes: int = 0) -> None:
        """Take a permit on the entry's model for `tenant` (its key), waiting in its queue if need be; `request`
        is charged to the key as it is served (fairness.py). `logits_bytes` is drawn from the model's generation
        logits pool with the permit: the request waits in the queue while the pool cannot hold it.

        Raises ShuttingDown while draining, QueueFull when the model's queue is full (for this key: its share
        of the queue), and ModelUnavailable when no permit frees within the queue timeout. Every successful
        acquire is paired with one `release` of the same tenant, request and logits_bytes.
        """
        if self.draining:
            raise ShuttingDown("the server is shutting down and takes no new requests",
                               retry_after_s=RETRY_AFTER_SHUTDOWN_S)
        entry.cancel_idle_timer()
        queued, now = entry.queued_by_key(), self._clock()
        entry.shares.activate(tenant, queued, now)
        keys = entry.shares.loads(queued, now)
        mine = next(k for k in keys if k.key == tenant.key)
        decision = policy.admit(entry.load_view(), self.total_running(), self._scheduling.max_running_total,
                                mine, keys)
        if decision is Admission.RUN and _pool_draw(entry, logits_bytes).fits:
            self._take(entry, tenant, request, logits_bytes)
            return
        if decision is Admission.REJECT:
            raise QueueFull(_queue_full(entry, mine, keys), retry_after_s=RETRY_AFTER_QUEUE_FULL_S)
        await self._wait(entry, priority, tenant, request, logits_bytes)

    async def _wait(self, entry: ModelEntry, priority: Priority, tenant: Tenant, request: Metered | None,
                    logits_bytes: int) -> None:
        """Wait in the queue until granted a permit (by `_dispatch`), refused (timeout, drain) or cancelled.

        Granting and expiring both settle the one future, so only the first counts. A request cancelled
        after it was granted, before it could run, passes its permit on."""
        waiter = Waiter.make(priority, next(self._arrivals), tenant, request, logits_bytes)
        entry.enqueue(waiter)
        self._dispatch()  # a permit kept free for this key, or for none any more, goes to whoever's turn it is
        expiry = asyncio.get_running_loop().call_later(self._scheduling.queue_timeout_s, self._expire, entry, waiter)
        try:
            await waiter.future
        except BaseException:
            if waiter in entry.waiters:
                entry.waiters.remove(waiter)
            if waiter.granted:
                self.release(entry, tenant, request, logits_bytes)
            raise
        finally:
            expiry.cancel()

    def _expire(self, entry: ModelEntry, waiter: Waiter) -> None:
        if not waiter.future.done():
            timeout = self._scheduling.queue_timeout_s
            why = f" ({waiter.waiting_for})" if waiter.waiting_for else ""
            waiter.future.set_exception(
                ModelUnavailable(f"model '{entry.name}' stayed busy for {timeout:.0f} s{why}; retry later",
                                 retry_after_s=RETRY_AFTER_BUSY_S))

    def release(self, entry: ModelEntry, tenant: Tenant = ANONYMOUS_TENANT, request: Metered | None = None,
                logits_bytes: int = 0) -> None:
        """Give back a permit and the request's draw on the generation logits pool: settle what the request was
        served, hand free permits to waiters, then report idleness."""
        entry.running -= 1
        entry.logits_used -= logits_bytes
        if request is not None:
            entry.shares.finish(tenant, request, self._clock())
        self._dispatch()
        if entry.idle:
            self._on_model_idle(entry)
        if self.total_running() == 0:
            self.quiet.set()
            self._on_quiet()

    def _take(self, entry: ModelEntry, tenant: Tenant, request: Metered | None, logits_bytes: int) -> None:
        entry.running += 1
        entry.logits_used += logits_bytes
        if request is not None:
            entry.shares.start(tenant, request)
        self.quiet.clear()
        self._on_busy()

    def _dispatch(self) -> None:
        """Hand free permits to waiters, in the order the policy picks: the model, then the key on it. A model whose
        next waiter's draw does not fit its generation logits pool waits (its turn with it, so no later request
        overtakes that one) until a running request gives its draw back."""
        limit = self._scheduling.max_running_total
        while True:
            turns = {name: self._turn(entry) for name, entry in self._entries.items() if entry.waiters}
            pooled = {name for name, turn in turns.items() if turn is not None and not self._fits(name, turn.key)}
            views = [self._entries[name].load_view() for name, turn in turns.items()
                     if turn is not None and name not in pooled]
            name = policy.pick_next(views, self.total_running(), limit)
            if name is None:
                self._recheck_later(pooled)
                return
            entry = self._entries[name]
            waiter = entry.waiters.pop(entry.head_of(turns[name].key))  # the key's best, taken off the queue
            if not waiter.future.done():
                self._take(entry, waiter.tenant, waiter.request, waiter.logits_bytes)
                waiter.future.set_result(True)

    def _fits(self, name: str, key: str) -> bool:
        """Whether the key's next waiter on the model fits the model's generation logits pool now (if not, it keeps
        the reason)."""
        entry = self._entries[name]
        if entry.engine.logits_pool is None:
            return True
        waiter = entry.waiters[entry.head_of(key)]
        if waiter.future.done():
            return True  # refused or cancelled meanwhile: taken off the queue, not granted
        draw = _pool_draw(entry, waiter.logits_bytes)
        waiter.waiting_for = draw.reason
        return draw.fits

    def _recheck_later(self, pooled: set[str]) -> None:
        """While a waiter waits beside a free permit (kept for a key present on the model), dispatch again when
        that key's presence may have ended. Models waiting for their logits pool (`pooled`) are dispatched when a
        request gives its draw back, not by time."""
        if self._recheck is not None or self.total_running() >= self._scheduling.max_running_total:
            return
        if any(entry.waiters and entry.running < entry.max_concurrency and name not in pooled
               for name, entry in self._entries.items()):
            self._recheck = asyncio.get_running_loop().call_later(self._scheduling.key_presence_s + 0.01,
                                                                  self._recheck_now)

    def _recheck_now(self) -> None:
        self._recheck = None
        self._dispatch()

    def _turn(self, entry: ModelEntry) -> policy.KeyTurn | None:
        free = entry.max_concurrency - entry.running
        return policy.pick_key(entry.key_loads(self._clock()), entry.max_concurrency, free) if free > 0 else None

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


def _pool_draw(entry: ModelEntry, logits_bytes: int) -> policy.PoolDraw:
    pool = entry.engine.logits_pool
    if pool is None or not logits_bytes:
        return policy.PoolDraw(True)
    return policy.draw_logits(logits_bytes, pool.pool_bytes, entry.logits_used)


def _queue_full(entry: ModelEntry, key: policy.KeyLoad, keys: list[policy.KeyLoad]) -> str:
    """The refusal's message: the model's queue is full, and the caller holds its share of it."""
    if len([k for k in keys if k.active or k.key == key.key]) <= 1:
        return f"model '{entry.name}' has {entry.queued} requests queued (the limit is {entry.max_queue}); retry shortly"
    return (f"model '{entry.name}' has {entry.queued} requests queued (the limit is {entry.max_queue}) and key "
            f"'{key.key}' holds {key.queued} of them, its share ({policy.share(entry.max_queue, key, keys)}); "
            "retry shortly")
