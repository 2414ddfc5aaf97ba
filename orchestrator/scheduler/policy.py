"""Every scheduling decision, as pure functions over plain data: state in, decision out.

The scheduler gathers these views from its live state and acts on the answers; nothing here awaits,
reads a clock, or touches a process, so each rule is tested with plain values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from orchestrator.engine.logits import size
from orchestrator.scheduler.settings import Priority

# -- admission --------------------------------------------------------------------------------------------------


class Admission(Enum):
    RUN = "run"  # take a permit now
    QUEUE = "queue"  # wait in the model's queue
    REJECT = "reject"  # the queue is full: 429


@dataclass(frozen=True)
class ModelLoad:
    """A model's admission state."""

    name: str
    running: int  # requests holding a permit (in the engine, or waiting for its load)
    queued: int
    max_concurrency: int
    max_queue: int
    weight: float = 1.0
    head_priority: Priority | None = None  # the best priority class waiting in its queue
    head_arrival: float = 0.0  # arrival order of that class's oldest waiter


def admit(model: ModelLoad, total_running: int, max_running_total: int, key: KeyLoad | None = None,
          keys: list[KeyLoad] | None = None) -> Admission:
    """What a newly arrived request for `model` does. Waiters are only ever blocked by a full model, a full
    device or a permit kept for another key (they are granted as soon as one frees), so a request may run at
    once only if both have room, nobody of its model waits ahead of it and its key `may_take` a permit.

    The queue bound is shared between keys: once the model's queue holds `max_queue`, a key below its share of
    it (`share`, among the keys present on the model) still queues, and a key at its share is refused. So one
    key's flood fills its own share, never another key's (the queue holds at most twice `max_queue`). `key` is
    the caller's state on the model and `keys` every key's there; without them (one caller) the model's bound
    is the key's."""
    keys = keys or []
    free = model.max_concurrency - model.running
    if free > 0 and total_running < max_running_total and model.queued == 0 and (
            key is None or may_take(key, keys, model.max_concurrency, free)):
        return Admission.RUN
    if model.queued >= model.max_queue and (key is None or key.queued >= share(model.max_queue, key, keys)):
        return Admission.REJECT
    return Admission.QUEUE


def pick_next(models: list[ModelLoad], total_running: int, max_running_total: int) -> str | None:
    """Which model's head waiter gets the next free permit, if any.

    Priority classes first (interactive before batch, across all models); within the best class waiting,
    weighted fair share: the model with the fewest running requests per unit of weight, oldest waiter on a
    tie. A model at its own concurrency limit is skipped, so one busy model cannot take another's turn.
    """
    if total_running >= max_running_total:
        return None
    eligible = [m for m in models if m.head_priority is not None and m.running < m.max_concurrency]
    if not eligible:
        return None
    best = max(m.head_priority for m in eligible)
    contenders = [m for m in eligible if m.head_priority == best]
    return min(contenders, key=lambda m: (m.running / m.weight, m.head_arrival)).name


# -- the generation logits pool ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolDraw:
    """Whether a request's draw on its model's generation logits pool fits now, and if not, why it waits."""

    fits: bool
    reason: str = ""


def draw_logits(need: int, pool_bytes: int, in_use: int) -> PoolDraw:
    """Whether a request needing `need` bytes of generation logits may run now beside the running requests' `in_use`
    of the model's `pool_bytes`. A request larger than the whole pool never reaches admission (a 400 before), so a
    request that does not fit waits in the queue for running ones to give theirs back."""
    if need <= pool_bytes - in_use:
        return PoolDraw(True)
    return PoolDraw(False, f"its top_logprobs need {size(need)} of the generation logits pool, which running "
                           f"requests hold {size(in_use)} of {size(pool_bytes)}")


# -- fairness between keys ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyLoad:
    """One API key's state on one model, for fairness between keys. `counter` is its virtual token counter: the
    tokens served to it divided by its weight (`fairness.py` keeps it). A key is present on the model while it
    has requests running or queued there, and for a while after (`scheduling.key_presence_s`): a client that
    sends one request after another is between two of them most of the time."""

    key: str
    running: int = 0  # permits its requests hold on the model
    queued: int = 0
    counter: float = 0.0
    weight: float = 1.0
    head_priority: Priority | None = None  # the best priority class it has waiting
    head_arrival: int = 0  # arrival order of its oldest waiter of that class
    recent: bool = False  # it was active on the model within the presence time

    @property
    def active(self) -> bool:
        return self.running > 0 or self.queued > 0

    @property
    def present(self) -> bool:
        return self.active or self.recent


def share(total: int, key: KeyLoad, keys: list[KeyLoad]) -> int:
    """A key's share of `total` (permits or queue places) among the keys present, itself counted whether present
    or not: in proportion to its weight, rounded up, at least one (of a total above zero: a queue of none has
    no place for anyone)."""
    if total <= 0:
        return 0
    weights = key.weight + sum(k.weight for k in keys if k.present and k.key != key.key)
    return max(1, math.ceil(total * key.weight / weights))


def kept_free(key: KeyLoad, keys: list[KeyLoad], max_concurrency: int) -> int:
    """Permits kept free from `key` when it holds its share: one for each other key present on the model, below
    its share and not waiting (its next request then runs at once instead of waiting for a long one to end)."""
    return sum(1 for k in keys if k.key != key.key and k.present and k.head_priority is None
               and k.running < share(max_concurrency, k, keys))


def may_take(key: KeyLoad, keys: list[KeyLoad], max_concurrency: int, free: int) -> bool:
    """Whether `key` may take one of the model's `free` permits: below its share always, at or above it only
    while that leaves the permits kept for other keys (`kept_free`)."""
    return key.running < share(max_concurrency, key, keys) or free - 1 >= kept_free(key, keys, max_concurrency)


@dataclass(frozen=True)
class KeyTurn:
    key: str
    reason: str


def pick_key(keys: list[KeyLoad], max_concurrency: int, free: int) -> KeyTurn | None:
    """Whose waiter gets one of the model's `free` permits: among the keys waiting in the best priority class,
    those below their share of the permits first, then the lowest virtual token counter (Sheng et al., "Fairness
    in Serving Large Language Models", OSDI 2024), the oldest waiter on a tie. A key at or above its share keeps
    what it runs (nothing is preempted) and takes more only while the permits kept for other present keys stay
    free (`may_take`). None: nobody waits, or the free permits are kept for keys that do not wait now."""
    waiting = [k for k in keys if k.head_priority is not None]
    if not waiting:
        return None
    best = max(k.head_priority for k in waiting)
    contenders = [k for k in waiting if k.head_priority == best]
    below = [k for k in contenders if k.running < share(max_concurrency, k, keys)]
    allowed = below or [k for k in contenders if may_take(k, keys, max_concurrency, free)]
    if not allowed:
        return None
    chosen = min(allowed, key=lambda k: (k.counter, k.head_arrival))
    if len(contenders) == 1:
        return KeyTurn(chosen.key, "the only key waiting")
    if below and len(below) < len(contenders):
        held = ", ".join(sorted(k.key for k in contenders if k not in below))
        return KeyTurn(chosen.key, f"below its share of permits, which {held} already hold; then the fewest tokens")
    return KeyTurn(chosen.key, f"the fewest tokens served per unit of weight ({chosen.counter:.0f})")


def lifted_counter(counter: float, keys: list[KeyLoad]) -> float:
    """The counter of a key that becomes active on a model: lifted to the lowest counter of the keys already
    active there, so that time spent idle is not banked as credit against them."""
    active = [k.counter for k in keys if k.active]
    return max(counter, min(active)) if active else counter


# -- placement ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """Bytes a model holds or needs: on the device, and in pinned host RAM (its host KV tier). Where the device
    is the host itself, the ledger counts both on the device and `host` is 0."""

    device: int
    host: int = 0

    def __add__(self, other: Memory) -> Memory:
        return Memory(self.device + other.device, self.host + other.host)

    def covers(self, need: Memory) -> bool:
        return self.device >= need.device and self.host >= need.host


@dataclass(frozen=True)
class Resident:
    """A model holding memory (loaded or loading)."""

    name: str
    footprint: Memory
    pinned: bool
    idle: bool  # no request running or queued, not loading
    last_used: float  # when it last finished a request (monotonic seconds)


@dataclass(frozen=True)
class KeptWeights:
    """An unloaded model's weights kept in host RAM (on the device where the device is the host), for its next load."""

    name: str
    held: Memory
    last_used: float  # when the model last finished a request (monotonic seconds)


class Placement(Enum):
    LOAD = "load"  # it fits now
    EVICT = "evict"  # it fits once these idle models are unloaded
    WAIT = "wait"  # it will fit when busy models become idle
    BLOCKED = "blocked"  # pinned models hold the memory: waiting will not help
    IMPOSSIBLE = "impossible"  # larger than the whole device (or than the host RAM offered for host KV tiers)


@dataclass(frozen=True)
class LoadPlan:
    placement: Placement
    evict: tuple[str, ...] = ()
    reason: str = ""
    drop: tuple[str, ...] = ()  # kept weights to drop first (LOAD and EVICT)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _short(need: Memory, room: Memory, device: str, host: str) -> str:
    """What `room` lacks for `need`, in words: the device's memory, the host's pinned RAM, or both."""
    parts = []
    if need.device > room.device:
        parts.append(f"{_gib(need.device)} and {device} {_gib(room.device)}")
    if need.host > room.host:
        parts.append(f"{_gib(need.host)} of pinned host RAM and {host} {_gib(room.host)}")
    return "; ".join(parts)


def _helps(held: Memory, room: Memory, need: Memory) -> bool:
    """Whether freeing `held` adds room where `room` is short of `need`."""
    return (held.device > 0 and room.device < need.device) or (held.host > 0 and room.host < need.host)


def _drops(need: Memory, free: Memory, kept: list[KeptWeights]) -> tuple[list[str], Memory]:
    """Kept weights to drop for `need`, least recently used first, only where they free what is short."""
    dropped, room = [], free
    for weights in sorted(kept, key=lambda k: k.last_used):
        if room.covers(need):
            break
        if _helps(weights.held, room, need):
            dropped.append(weights.name)
            room += weights.held
    return dropped, room


def plan_load(need: Memory, free: Memory, usable: Memory, residents: list[Resident],
              kept: list[KeptWeights] = ()) -> LoadPlan:
    """How to make room for a model needing `need`, given `free` now out of the `usable` memory (capacity minus
    reserve, on the device and in pinned host RAM): first drop kept weights, least recently used first, then evict idle
    unpinned models, least recently used first, until both fit. Kept weights never stop a load: they go before any
    loaded model does, and count as room when deciding to wait. `kept` leaves out the loading model's own (its load
    uses them: `free` counts them). Host RAM is refused as device memory is: never over-committed."""
    if not usable.covers(need):
        short = _short(need, usable, "the device offers", "the host offers")
        return LoadPlan(Placement.IMPOSSIBLE, reason=f"it needs {short}")
    if free.covers(need):
        return LoadPlan(Placement.LOAD)
    dropped, room = _drops(need, free, kept)
    if room.covers(need):
        return LoadPlan(Placement.LOAD, drop=tuple(dropped),
                        reason=f"dropping the kept weights of {', '.join(dropped)} makes room")
    chosen: list[str] = []
    for resident in sorted((r for r in residents if r.idle and not r.pinned), key=lambda r: r.last_used):
        chosen.append(resident.name)
        room += resident.footprint
        if room.covers(need):
            return LoadPlan(Placement.EVICT, tuple(chosen), drop=tuple(dropped))
    freeable = free + sum((k.held for k in kept), Memory(0))
    unpinned = sum((r.footprint for r in residents if not r.pinned), Memory(0))
    if (freeable + unpinned).covers(need):
        busy = sorted(r.name for r in residents if not r.pinned and not r.idle)
        return LoadPlan(Placement.WAIT, reason=f"busy models hold the memory it needs: {', '.join(busy)}")
    names = ", ".join(sorted(r.name for r in residents if r.pinned))
    return LoadPlan(
        Placement.BLOCKED,
        reason=f"it needs {_short(need, freeable + unpinned, f'pinned models ({names}) leave', 'they leave')}",
    )


@dataclass(frozen=True)
class KeepPlan:
    """Whether an unloaded model's weights are kept, which kept weights make way for them, and why not."""

    keep: bool
    drop: tuple[str, ...] = ()
    reason: str = ""


def _bytes(memory: Memory) -> int:
    return memory.device + memory.host


def plan_keep(weights: KeptWeights, budget: int, kept: list[KeptWeights], free: Memory) -> KeepPlan:
    """Whether `weights` (a model just unloaded) may be kept: within the `budget` of bytes for kept weights and
    within the memory `free` now (never room loaded or loading models hold), where dropping kept weights used no more
    recently than it, least recently used first, makes room; else it is not kept."""
    size = _bytes(weights.held)
    if size > budget:
        return KeepPlan(False, reason=f"its weights ({_gib(size)}) exceed the budget for kept weights ({_gib(budget)})")
    spare, room, dropped = budget - sum(_bytes(k.held) for k in kept), free, []
    for other in sorted((k for k in kept if k.last_used <= weights.last_used), key=lambda k: k.last_used):
        if spare >= size and room.covers(weights.held):
            break
        dropped.append(other.name)
        spare, room = spare + _bytes(other.held), room + other.held
    if spare >= size and room.covers(weights.held):
        return KeepPlan(True, tuple(dropped))
    return KeepPlan(False, reason=f"its weights ({_gib(size)}) fit neither the budget left for kept weights nor the "
                                  f"free memory, once kept weights used less recently are dropped")


# -- failures and idleness --------------------------------------------------------------------------------------

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0


def backoff_s(consecutive_failures: int) -> float:
    """Delay before the next load after load failures or crashes in a row: the first retry is immediate,
    then 1, 2, 4 ... seconds, at most a minute."""
    return 0.0 if consecutive_failures <= 1 else min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (consecutive_failures - 2))


def idle_unload_delay(keep_alive_s: float, pinned: bool) -> float | None:
    """Seconds an idle model stays loaded before it is unloaded; None: it stays until evicted."""
    return None if pinned or keep_alive_s < 0 else keep_alive_s
