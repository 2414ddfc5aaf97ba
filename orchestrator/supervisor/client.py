"""The HTTP process's handle on one worker process (a `WorkerHandle`): start it, send it requests, route its
step frames to the requests they belong to, and notice at once when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal

from orchestrator.backends.protocol import BackendStats
from orchestrator.engine.request import EngineRequest
from orchestrator.errors import InfernoError, ModelUnavailable, WorkerCrashed, to_wire
from orchestrator.ipc.channel import ChannelClosed
from orchestrator.ipc.messages import (
    ROW_FINISH,
    ROW_REQUEST_ID,
    Cancel,
    Idle,
    LoadFailed,
    LoadSpec,
    MalformedFrame,
    Release,
    Shutdown,
    StatsQuery,
    StatsReport,
    Step,
    Submit,
    TextDelta,
    WorkerReady,
    decode_from_worker,
)
from orchestrator.supervisor.handle import OnExit, Sink
from orchestrator.supervisor.process import WorkerProcess

log = logging.getLogger(__name__)

EXIT_CODE_WAIT_S = 0.5  # after the channel closes, how long to wait for the exit status for the error message


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class WorkerClient:
    """One model's worker, from the load message on."""

    def __init__(self, model: str, process: WorkerProcess, on_exit: OnExit):
        self.model = model
        self._proc = process.process
        self._channel = process.channel
        self._handoff = process.handoff
        self._on_exit = on_exit
        self._sinks: dict[str, Sink] = {}
        self._stats_waiters: dict[int, asyncio.Future] = {}
        self._seq = itertools.count()
        self._reader: asyncio.Task | None = None
        self._stopping = False
        self._released: asyncio.Future[bool] | None = None  # set by release(): did the worker say "idle"?
        self.alive = False
        self.ready: WorkerReady | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def start(self, spec: LoadSpec, timeout_s: float) -> WorkerReady:
        """Have the worker load its engine and wait until it is ready; raises ModelUnavailable and its kin."""
        self._channel.send(spec.to_wire())
        try:
            answer = await asyncio.wait_for(self._load_answer(), timeout_s)
        except (TimeoutError, ChannelClosed, MalformedFrame) as exc:
            await self._kill()
            if isinstance(exc, MalformedFrame):
                log.error("the worker for %s answered its load with a malformed frame: %s", self.model, exc)
                reason = "it answered with a malformed message"
            elif isinstance(exc, TimeoutError):
                reason = f"timed out after {timeout_s:.0f} s"
            else:
                reason = describe_exit(self._proc.returncode)
            raise ModelUnavailable(f"the worker for model '{self.model}' failed while loading ({reason})") from exc
        if isinstance(answer, LoadFailed):
            await self._reap()
            raise answer.error
        self.ready = answer
        self.alive = True
        self._reader = asyncio.create_task(self._read_loop(), name=f"worker-reader-{self.model}")
        return self.ready

    async def _load_answer(self) -> WorkerReady | LoadFailed:
        """"ready" or "failed", after the greeting a fresh worker sends before it sees the load; MalformedFrame
        for anything else."""
        while True:
            message = decode_from_worker(await self._channel.recv())
            if isinstance(message, WorkerReady | LoadFailed):
                return message
            if not isinstance(message, Idle):
                raise MalformedFrame(f"a '{message.KIND}' frame came before the load's answer")

    def submit(self, request: EngineRequest, sink: Sink, attach: tuple[int, bytes, bytes, bytes] | None = None
               ) -> bool:
        if not self.alive:
            raise WorkerCrashed(f"the worker for model '{self.model}' is gone")
        self._sinks[request.id] = sink
        handed = attach is not None and self._handoff is not None and self._handoff.give(request.id, attach[0])
        parts = tuple(part.decode("latin-1") for part in attach[1:]) if handed else None
        try:
            self._channel.send(Submit(request, parts).to_wire())
        except ChannelClosed:
            self._sinks.pop(request.id, None)
            raise WorkerCrashed(f"the worker for model '{self.model}' is gone") from None
        return handed

    def cancel(self, request_id: str) -> None:
        """Stop a request in the engine; no more deltas reach its sink."""
        if self._sinks.pop(request_id, None) is not None:
            with contextlib.suppress(ChannelClosed):
                self._channel.send(Cancel(request_id).to_wire())

    def end(self, request_id: str, error: InfernoError) -> None:
        if request_id in self._sinks:
            with contextlib.suppress(ChannelClosed):
                self._channel.send(Cancel(request_id, to_wire(error)).to_wire())

    async def stats(self, timeout_s: float = 1.0) -> BackendStats | None:
        """The engine's stats snapshot, or None if the worker does not answer in time."""
        if not self.alive or self._stopping:
            return None
        seq = next(self._seq)
        waiter = asyncio.get_running_loop().create_future()
        self._stats_waiters[seq] = waiter
        try:
            self._channel.send(StatsQuery(seq).to_wire())
            return await asyncio.wait_for(waiter, timeout_s)
        except (TimeoutError, ChannelClosed):
            return None
        finally:
            self._stats_waiters.pop(seq, None)

    async def stop(self, timeout_s: float) -> int | None:
        """Ask the worker to exit, kill it after timeout_s; returns its exit code."""
        self._stopping = True
        if self._channel is not None:
            with contextlib.suppress(ChannelClosed):
                self._channel.send(Shutdown().to_wire())
        if self._proc is not None:
            try:
                await asyncio.wait_for(self._proc.wait(), timeout_s)
            except TimeoutError:
                log.warning("worker for %s did not exit in %.0f s: killing it", self.model, timeout_s)
                await self._kill()
        if self._reader is not None:
            await self._reader
        return self._proc.returncode if self._proc else None

    async def release(self, timeout_s: float) -> WorkerProcess | None:
        """Have the worker close its engine and become a spare again, where its backend returns all of the
        engine's memory (`LoadReport.reusable`); the process, idle, or None when it exited or was killed
        instead (it could not, it took longer than timeout_s, or it was not reusable: then it was stopped)."""
        if not (self.alive and self.ready is not None and self.ready.load.reusable):
            await self.stop(timeout_s)
            return None
        self._stopping = True
        self._released = asyncio.get_running_loop().create_future()
        try:
            self._channel.send(Release().to_wire())
            idle = await asyncio.wait_for(asyncio.shield(self._released), timeout_s)
        except (TimeoutError, ChannelClosed):
            idle = False
        if not idle:
            await self._kill()
            self._close()
        if self._reader is not None:
            await self._reader
        return WorkerProcess(self._proc, self._channel, self._handoff) if idle else None

    async def _read_loop(self) -> None:
        try:
            while True:
                message = decode_from_worker(await self._channel.recv())
                if type(message) is Idle and self._released is not None:
                    self._released.set_result(True)  # released: the process goes back to the pool
                    break
                if type(message) is Step:
                    self._dispatch(message.rows)
                elif type(message) is StatsReport:
                    waiter = self._stats_waiters.get(message.seq)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(message.stats)
                else:
                    raise MalformedFrame(f"a '{message.KIND}' frame came from a loaded worker")
        except ChannelClosed:
            pass
        except MalformedFrame as exc:  # a worker that speaks nonsense is ended, as if it had crashed
            log.error("the worker for %s sent a malformed frame, ending it: %s", self.model, exc)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        self.alive = False
        if self._released is not None and self._released.done():
            self._on_exit(self.model)
            self._fail_all(WorkerCrashed(f"the model '{self.model}' was unloaded while running this request"))
            return
        if self._released is not None:
            self._released.set_result(False)
        self._close()
        self._on_exit(self.model)  # before anything else: new requests must not reach this worker
        try:
            code = await asyncio.wait_for(self._proc.wait(), EXIT_CODE_WAIT_S)
        except TimeoutError:
            code = None
        if not self._stopping:
            log.error("worker for %s exited unexpectedly (%s)", self.model, describe_exit(code))
        self._fail_all(
            WorkerCrashed(
                f"the worker for model '{self.model}' exited ({describe_exit(code)}) while running this request"
            )
        )

    def _dispatch(self, rows: list[list]) -> None:
        """One step frame: each row (TextDelta.to_wire) to its request's sink, as it came off the wire."""
        sinks = self._sinks
        for row in rows:
            sink = sinks.get(row[ROW_REQUEST_ID])
            if sink is None:
                continue  # cancelled by us; its last words are not needed
            if row[ROW_FINISH] is not None:
                del sinks[row[ROW_REQUEST_ID]]
            sink(row)

    def _close(self) -> None:
        self._channel.close()
        if self._handoff is not None:
            self._handoff.close()

    def _fail_all(self, error: InfernoError) -> None:
        sinks, self._sinks = self._sinks, {}
        for request_id, sink in sinks.items():
            sink(TextDelta.failure(request_id, error).to_wire())

    async def _kill(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()

    async def _reap(self) -> None:
        try:
            await asyncio.wait_for(self._proc.wait(), 10)
        except TimeoutError:
            await self._kill()
