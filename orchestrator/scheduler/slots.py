"""A model's place in the server: its load state, its worker, and its admission queue."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

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
    loads: int = 0
    load_failures: int = 0
    last_error: str | None = None
    load_task: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def queued(self) -> int:
        return len(self.waiters)
