"""Workers that live in the event loop, standing in for worker processes (`WorkerHandle`, `WorkerSource`),
so the scheduler and the app run in-process. The test scripts everything a worker would do: loads (held
until released, or failing), each engine step's output, crashes. What the scheduler and the app do to the
workers (loads, submits, cancels, stops, spare refills) is recorded for the test to check.

Like `WorkerClient`, a worker that goes away tells the scheduler first (`on_exit`), then fails every request
still in flight with WorkerCrashed.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from orchestrator.backends.protocol import BackendStats, LoadReport
from orchestrator.engine.request import EngineRequest, FinishReason
from orchestrator.errors import InfernoError, ModelUnavailable, WorkerCrashed, to_wire
from orchestrator.ipc.messages import LoadSpec, TextDelta, WorkerReady
from orchestrator.scheduler.ledger import DeviceReading
from orchestrator.supervisor.handle import OnExit, Sink

FIRST_PID = 10_000_000  # above Linux's largest pid: never a real process


class FakeWorker:
    def __init__(self, model: str, pid: int, on_exit: OnExit, source: FakeWorkers):
        self.model = model
        self._pid = pid
        self._on_exit = on_exit
        self._source = source
        self.alive = False
        self.spec: LoadSpec | None = None
        self.sinks: dict[str, Sink] = {}  # requests in flight
        self.submitted: list[EngineRequest] = []
        self.cancelled: list[str] = []  # ids cancelled while in flight
        # A copy of each client socket taken, the response's head and its chunk's bytes around the text.
        self.sockets: dict[str, tuple[int, bytes, bytes, bytes]] = {}
        self.stopped = False
        self.released = False  # kept as the spare when its model was unloaded

    @property
    def pid(self) -> int:
        return self._pid

    async def start(self, spec: LoadSpec, timeout_s: float) -> WorkerReady:
        self.spec = spec
        hold = self._source.holds.get(self.model)
        if hold is not None:
            try:
                await asyncio.wait_for(hold.wait(), timeout_s)
            except TimeoutError:
                raise ModelUnavailable(f"the worker for model '{self.model}' failed while loading (timed out)") from None
        failures = self._source.failures.get(self.model)
        if failures:
            raise failures.pop(0)
        self.alive = True
        # No memory to measure here (rss 0): the ledger keeps its estimate.
        return WorkerReady(self.pid, rss_bytes=0, load=LoadReport("fake"))

    def submit(self, request: EngineRequest, sink: Sink, attach: tuple[int, bytes, bytes, bytes] | None = None
               ) -> bool:
        if not self.alive:
            raise WorkerCrashed(f"the worker for model '{self.model}' is gone")
        self.sinks[request.id] = sink
        self.submitted.append(request)
        self._source.submits.put_nowait((self, request))
        if self._source.submit_error is not None:
            raise self._source.submit_error
        if attach is None or not self._source.take_sockets:
            return False  # no process to hand a socket to: the app writes every row
        fd, head, prefix, suffix = attach
        self.sockets[request.id] = (os.dup(fd), head, prefix, suffix)
        return True

    def cancel(self, request_id: str) -> None:
        if self.sinks.pop(request_id, None) is not None:
            self.cancelled.append(request_id)
            self._source.cancels.put_nowait(request_id)

    def end(self, request_id: str, error: InfernoError) -> None:
        """As a worker does: stopped in its engine, its last delta is the failure."""
        if request_id in self.sinks:
            self.cancelled.append(request_id)
            self._source.cancels.put_nowait(request_id)
            self.emit(request_id, error=error)

    async def stats(self, timeout_s: float) -> BackendStats | None:
        """A made-up KV cache of 64 blocks of 16 tokens, none in use."""
        if not self.alive:
            return None
        return BackendStats(running=len(self.sinks), waiting=0, kv_blocks_total=64, kv_blocks_free=64,
                            kv_blocks_used=0, tokens_per_block=16, iterations=0)

    async def stop(self, timeout_s: float) -> int | None:
        self.stopped = True
        self._go_away("exit code 0")
        return 0

    # -- what the test scripts ------------------------------------------------------------------------------
    def emit(self, request_id: str, text: str = "", tokens: int | None = None, finish: FinishReason | None = None,
             error: InfernoError | None = None) -> None:
        """One engine step's output for one request (text, then finally a finish reason)."""
        sink = self.sinks[request_id]
        if finish is not None or error is not None:
            del self.sinks[request_id]
        wire_error = to_wire(error) if error is not None else None
        count = len(text.split()) if tokens is None else tokens
        sink(TextDelta(request_id, text, count, FinishReason.ERROR if error is not None else finish, wire_error).to_wire())

    def finish(self, request_id: str, text: str = "done", finish: FinishReason = FinishReason.STOP) -> None:
        self.emit(request_id, text, finish=finish)

    def crash(self) -> None:
        """The worker process dies (SIGKILL)."""
        self._go_away("killed by SIGKILL")

    def _go_away(self, how: str) -> None:
        self.alive = False
        self._on_exit(self.model)
        sinks, self.sinks = self.sinks, {}
        for request_id, sink in sinks.items():
            error = WorkerCrashed(f"the worker for model '{self.model}' exited ({how}) while running this request")
            sink(TextDelta.failure(request_id, error).to_wire())


class FakeWorkers:
    """The `WorkerSource`: hands out FakeWorkers and records the refill calls the scheduler makes."""

    def __init__(self):
        self.started: list[FakeWorker] = []
        self.holds: dict[str, asyncio.Event] = {}
        self.failures: dict[str, list[InfernoError]] = {}
        self.submit_error: Exception | None = None  # raised by every submit, after it is recorded
        self.take_sockets = False  # take the client's socket a stream offers with its submit (a copy, to write to)
        self.submits: asyncio.Queue[tuple[FakeWorker, EngineRequest]] = asyncio.Queue()
        self.cancels: asyncio.Queue[str] = asyncio.Queue()
        self.calls: list[str] = []  # refill, load_finished(True), server_busy, server_quiet, stop_refilling, close
        self._pids = itertools.count(FIRST_PID)
        self.spare_state = "none"
        self.spare_pid = None
        self.keeps_released = False  # retire keeps a released worker as the spare (its backend is reusable)
        self.release_gate: asyncio.Event | None = None  # a release waits for it

    def hold_loads(self, model: str) -> asyncio.Event:
        """Loads of `model` wait until the returned event is set."""
        return self.holds.setdefault(model, asyncio.Event())

    def fail_next_load(self, model: str, error: InfernoError) -> None:
        self.failures.setdefault(model, []).append(error)

    def of(self, model: str) -> list[FakeWorker]:
        return [w for w in self.started if w.model == model]

    async def next_submit(self) -> tuple[FakeWorker, EngineRequest]:
        return await asyncio.wait_for(self.submits.get(), 30)  # bounded only so that a broken test fails

    # -- WorkerSource -----------------------------------------------------------------------------------------
    async def take(self, model: str, on_exit: OnExit) -> FakeWorker:
        worker = FakeWorker(model, next(self._pids), on_exit, self)
        self.started.append(worker)
        return worker

    async def retire(self, worker: FakeWorker, timeout_s: float, reuse: bool) -> bool:
        """Stopped, unless `keeps_released` (the real pool's rules: tests/unit/test_worker_pool.py): then, with
        `reuse`, released (once `release_gate` opens) and kept."""
        self.calls.append(f"retire(reuse={reuse})")
        if not (reuse and self.keeps_released):
            await worker.stop(timeout_s)
            return False
        if self.release_gate is not None:
            await self.release_gate.wait()
        worker.released = True
        worker._go_away("released")
        return True

    def refill(self) -> None:
        self.calls.append("refill")

    def load_finished(self, succeeded: bool) -> None:
        self.calls.append(f"load_finished({succeeded})")

    def server_busy(self) -> None:
        self.calls.append("server_busy")

    def server_quiet(self) -> None:
        self.calls.append("server_quiet")

    def stop_refilling(self) -> None:
        self.calls.append("stop_refilling")

    async def close(self) -> None:
        self.calls.append("close")


class FakeDevice:
    """A `DeviceProbe` for a device of `total_bytes` with nothing else on it."""

    name = "fake:0"

    def __init__(self, total_bytes: int):
        self.total_bytes = total_bytes

    def read(self) -> DeviceReading:
        return DeviceReading(self.total_bytes, 0, self.total_bytes)

    def process_bytes(self, pid: int) -> int | None:
        return None
