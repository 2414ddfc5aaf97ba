"""The one boundary between the scheduler and model workers: what the scheduler asks of a worker
(`WorkerHandle`), and where it gets workers from (`WorkerSource`).

`WorkerClient` over a worker process and `WorkerPool` (supervisor/pool.py) are the real ones; because the
scheduler knows only these protocols, a worker that lives in the event loop can stand in for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from orchestrator.backends.protocol import BackendStats
from orchestrator.engine.request import EngineRequest
from orchestrator.errors import InfernoError
from orchestrator.ipc.messages import LoadSpec, WorkerReady

# Where a request's output goes: one call per engine step, with the step's wire row (messages.TextDelta.to_wire).
Sink = Callable[[list], None]
OnExit = Callable[[str], None]  # told the model's name when its worker goes away, asked to or not


class WorkerHandle(Protocol):
    """One model's worker, from its load on."""

    model: str
    alive: bool  # loaded and serving; False once it has gone away

    @property
    def pid(self) -> int: ...

    async def start(self, spec: LoadSpec, timeout_s: float) -> WorkerReady:
        """Load the engine; raises ModelUnavailable (or a subclass) if it cannot within timeout_s."""
        ...

    def submit(self, request: EngineRequest, sink: Sink, attach: tuple[int, bytes, bytes, bytes] | None = None
               ) -> bool:
        """Start a request; its deltas go to `sink`, the last one with a finish reason (an error included).
        Raises WorkerCrashed if the worker is gone. `attach`: the client's socket, the response's head and the
        bytes around a chunk's text as JSON, for the worker to write the request's plain text itself
        (worker/direct.py). True where the socket went over."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a request in the engine; no more deltas reach its sink."""
        ...

    def end(self, request_id: str, error: InfernoError) -> None:
        """End a request with `error`: its worker stops it and sends the failure as its last delta, after whatever
        it wrote to the client itself (an attached stream: only the worker knows what went)."""
        ...

    async def stats(self, timeout_s: float) -> BackendStats | None:
        """The engine's stats, or None if the worker does not answer in time."""
        ...

    async def stop(self, timeout_s: float) -> int | None:
        """Make the worker exit (killed after timeout_s); returns its exit code where there is one."""
        ...


class WorkerSource(Protocol):
    """Where workers come from; it keeps a spare ready and is told how busy the server is, to time refills."""

    @property
    def spare_state(self) -> str:
        """none | starting | warm."""
        ...

    @property
    def spare_pid(self) -> int | None:
        """The warm spare's process id."""
        ...

    async def take(self, model: str, on_exit: OnExit) -> WorkerHandle:
        """A worker for `model`, not yet loaded (the spare when there is one)."""
        ...

    async def retire(self, worker: WorkerHandle, timeout_s: float, reuse: bool) -> bool:
        """End a model's worker (its model is unloaded): kept as the spare where `reuse` allows and it can give
        its engine's memory back, else stopped. True when it was kept."""
        ...

    def refill(self) -> None:
        """Start a spare now if none is waiting."""
        ...

    def load_finished(self, succeeded: bool) -> None:
        """A load that took a worker has ended."""
        ...

    def server_busy(self) -> None:
        """A request has taken a permit."""
        ...

    def server_quiet(self) -> None:
        """No request holds a permit any more."""
        ...

    def stop_refilling(self) -> None:
        """The server is draining: start no more spares."""
        ...

    async def close(self) -> None:
        """Stop the spare, if any."""
        ...
