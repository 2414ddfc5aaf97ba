"""What the scheduler shows the outside (metrics, the admin API): plain snapshots and event hooks.

Readers depend on these types only, never on the scheduler's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class PoolSnapshot:
    """A model's generation logits pool (trtllm, generation_logits on): pinned host RAM held while it is loaded, and
    what its admitted top_logprobs requests hold of it."""

    size_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class KeptSnapshot:
    """An unloaded model's weights kept in host RAM for its next load (supervisor/keeper.py)."""

    bytes: int  # as the memory ledger counts them
    pinned: bool  # locked in RAM (mlock); False: mapped, and the kernel may drop them under pressure
    since: float  # when they were kept (Unix time)


@dataclass(frozen=True)
class ModelSnapshot:
    name: str
    backend: str
    state: str  # a ModelState value: unloaded, loading, ready, unloading, failed (see ModelState)
    pinned: bool
    running: int  # requests in the engine
    queued: int  # requests waiting for a permit or for the model's load
    loads: int  # successful loads since the server started
    load_failures: int
    evictions: int  # unloads to make room for another model
    crashes: int  # worker processes that died unexpectedly
    memory_bytes: int  # the model's footprint on its device: measured while loaded, estimated otherwise
    idle_seconds: float  # since the model last finished a request
    last_error: str | None  # why the last load failed or the worker died; None once the model loads again
    pid: int | None = None  # the worker process, while one is assigned
    retry_in_s: float | None = None  # while failed: seconds until the next load may be tried
    generation_logits_pool: PoolSnapshot | None = None  # None: the model has none
    kept_weights: KeptSnapshot | None = None  # None: its weights are not kept


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cuda:0", "cpu"
    total_bytes: int  # the device's capacity as the ledger sees it
    used_bytes: int  # in use on the device (measured: NVML for GPUs, RAM for the CPU)
    reserved_bytes: int  # held back from models


class SchedulerEvents(Protocol):
    """Called by the scheduler as things happen; implementations must be cheap and never raise."""

    def model_loaded(self, model: str, seconds: float) -> None: ...

    def model_unloaded(self, model: str, reason: str) -> None: ...  # evicted | idle | admin | shutdown

    def worker_crashed(self, model: str) -> None: ...


class NoEvents:
    def model_loaded(self, model: str, seconds: float) -> None:
        pass

    def model_unloaded(self, model: str, reason: str) -> None:
        pass

    def worker_crashed(self, model: str) -> None:
        pass
