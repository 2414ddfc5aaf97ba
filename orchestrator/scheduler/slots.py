"""A model's place in the server: its load state, its worker, and its admission queue."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from orchestrator.scheduler.observe import ModelSnapshot
from orchestrator.scheduler.registry import Engine
from orchestrator.worker.client import WorkerClient


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


@dataclass
class Waiter:
    """A request waiting for a running slot."""

    priority: int
    arrived: float
    future: asyncio.Future


@dataclass
class ModelSlot:
    engine: Engine
    max_concurrency: int
    max_queue: int
    state: ModelState = ModelState.UNLOADED
    worker: WorkerClient | None = None
    running: int = 0
    waiters: deque[Waiter] = field(default_factory=deque)
    last_used: float = field(default_factory=time.monotonic)
    pinned: bool = False
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    crashes: int = 0
    memory_bytes: int = 0  # measured footprint while loaded
    last_error: str | None = None
    load_task: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def queued(self) -> int:
        return len(self.waiters)

    def snapshot(self) -> ModelSnapshot:
        return ModelSnapshot(
            name=self.name,
            backend=self.engine.manifest.backend,
            state=self.state.value,
            pinned=self.pinned,
            running=self.running if self.state is ModelState.READY else 0,
            queued=self.queued + (self.running if self.state is not ModelState.READY else 0),
            loads=self.loads,
            load_failures=self.load_failures,
            evictions=self.evictions,
            crashes=self.crashes,
            memory_bytes=self.memory_bytes,
            idle_seconds=0.0 if self.running else time.monotonic() - self.last_used,
            last_error=self.last_error,
        )
