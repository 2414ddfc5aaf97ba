"""Worker processes for the scheduler (a `WorkerSource`), with one spare kept ready.

A spare has already started Python and imported the backends' runtimes (torch, transformers, TensorRT-LLM),
which is most of a cold start; handing it a model to load makes loads fast. When the next spare starts is
the refill policy (`worker.spare_refill`): right after a load on machines with cores to spare
(`after-load`), or once the server has been quiet for a second (`when-idle`), because a spare's imports
take a core for seconds and would slow down the requests that follow a load on a small machine.

An unloaded model's worker becomes the spare where its backend gives all of its engine's memory back when
closed (`retire`, `WorkerClient.release`): the next load, a swap's included, then needs no new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from orchestrator.config import ServerConfig
from orchestrator.ipc.messages import Idle, MalformedFrame
from orchestrator.supervisor.client import WorkerClient
from orchestrator.supervisor.handle import OnExit
from orchestrator.supervisor.process import WorkerProcess, spawn_worker

log = logging.getLogger(__name__)

RefillMode = Literal["after-load", "when-idle"]
QUIET_BEFORE_REFILL_S = 1.0  # when-idle: quiet time before a new spare starts importing its runtimes
EAGER_REFILL_CORES = 8  # with this many cores a spare's imports hardly compete with serving

Spawn = Callable[[], Awaitable[WorkerProcess]]


def refill_mode(setting: str, cores: int) -> RefillMode:
    """The refill policy for a `worker.spare_refill` setting on a machine with `cores` cores."""
    if setting == "auto":
        return "after-load" if cores >= EAGER_REFILL_CORES else "when-idle"
    if setting not in ("after-load", "when-idle"):
        raise ValueError(f"worker.spare_refill must be auto, after-load or when-idle (got {setting!r})")
    return setting


class WorkerPool:
    def __init__(self, spawn: Spawn, keep_spare: bool, refill: RefillMode, quiet_s: float = QUIET_BEFORE_REFILL_S):
        self._spawn = spawn
        self._keep_spare = keep_spare
        self._refill = refill
        self._quiet_s = quiet_s
        self._spare: asyncio.Future[WorkerProcess] | None = None
        self._busy = False  # some request holds a permit
        self._refilling = True  # False once the server drains or the pool closes
        self._timer: asyncio.TimerHandle | None = None
        self._discarding: asyncio.Task | None = None

    @classmethod
    def for_config(cls, config: ServerConfig, backends: tuple[str, ...], cores: int) -> WorkerPool:
        """Worker processes that preload `backends`' runtimes, on a machine with `cores` cores."""
        spawn = functools.partial(spawn_worker, backends, config.log_level)
        return cls(spawn, config.worker.spare, refill_mode(config.worker.spare_refill, cores))

    async def take(self, model: str, on_exit: OnExit) -> WorkerClient:
        return WorkerClient(model, await self._take_process(), on_exit)

    async def _take_process(self) -> WorkerProcess:
        """The spare if there is a live one, else a freshly started process."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                process = await spare
                if not process.exited:
                    return process
            except Exception as exc:
                log.warning("the spare worker failed to start: %s", exc)
        return await self._spawn()

    async def retire(self, worker: WorkerClient, timeout_s: float, reuse: bool) -> bool:
        """End a model's worker. With `reuse` (an eviction or an unload, not a shutdown) and spares kept, it is
        released and becomes the spare (a spare waiting already is stopped: one is enough); else, or when it
        cannot give its engine's memory back, it exits (killed after timeout_s). True when it was kept."""
        if not (reuse and self._keep_spare and self._refilling):
            await worker.stop(timeout_s)
            return False
        process = await worker.release(timeout_s)
        if process is None:
            return False
        waiting, self._spare = self._spare, asyncio.get_running_loop().create_future()
        self._spare.set_result(process)
        self._cancel_timer()
        if waiting is not None:
            self._discarding = asyncio.create_task(_discard(waiting), name="discard-spare")
        log.info("worker %d kept as the spare", process.pid)
        return True

    @property
    def spare_state(self) -> str:
        """none | starting (still importing the runtimes) | warm (ready for a load at once)."""
        spare = self._spare
        if spare is None or (spare.done() and (spare.cancelled() or spare.exception() is not None)):
            return "none"
        return "warm" if spare.done() else "starting"

    @property
    def spare_pid(self) -> int | None:
        return self._spare.result().pid if self.spare_state == "warm" else None

    # -- the refill policy --------------------------------------------------------------------------------
    def refill(self) -> None:
        """Start a new spare if none is waiting."""
        if self._keep_spare and self._spare is None and self._refilling:
            self._spare = asyncio.create_task(self._start_spare(), name="spare-worker")

    def load_finished(self, succeeded: bool) -> None:
        if not succeeded:
            self._refill_when_quiet()
        elif self._refill == "after-load":
            self.refill()

    def server_busy(self) -> None:
        self._busy = True
        self._cancel_timer()

    def server_quiet(self) -> None:
        self._busy = False
        self._refill_when_quiet()

    def stop_refilling(self) -> None:
        self._refilling = False
        self._cancel_timer()

    def _refill_when_quiet(self) -> None:
        if self._refill == "after-load":
            self.refill()
            return
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(self._quiet_s, self._refill_if_quiet)

    def _refill_if_quiet(self) -> None:
        self._timer = None
        if not self._busy:
            self.refill()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- spares -------------------------------------------------------------------------------------------
    async def _start_spare(self) -> WorkerProcess:
        """A spare is ready once it greets with "idle": its runtimes are imported. MalformedFrame (the spare is
        killed) for any other first frame."""
        process = await self._spawn()
        try:
            Idle.from_wire(await process.channel.recv())
        except (MalformedFrame, asyncio.CancelledError):  # cancelled: not needed any more (see retire)
            await process.kill()
            raise
        return process

    async def close(self) -> None:
        self.stop_refilling()
        spare, self._spare = self._spare, None
        if spare is not None:
            with contextlib.suppress(Exception):
                await (await spare).kill()


async def _discard(spare: asyncio.Future[WorkerProcess]) -> None:
    """Stop a spare: one still importing its runtimes at once (its start kills the process), else its process."""
    if not spare.done():
        spare.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await (await spare).kill()
