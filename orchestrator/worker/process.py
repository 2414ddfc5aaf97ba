"""Starting worker processes, and keeping one spare ready.

A spare has already started Python and imported the backends' runtimes (torch, transformers, TensorRT-LLM),
which is most of a cold start; handing it a model to load makes loads fast. After a spare is taken, a new
one is started once the load that took it has finished, so the two never compete for the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from dataclasses import dataclass

from orchestrator.worker.ipc import Channel

log = logging.getLogger(__name__)

# Weights come only from engine folders: a worker never reaches for a model hub.
WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    channel: Channel

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        self.channel.close()


async def spawn_worker(preload: tuple[str, ...], log_level: str) -> WorkerProcess:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "orchestrator.worker",
            "--fd", str(child.fileno()), "--preload", ",".join(preload), "--log-level", log_level,
            pass_fds=(child.fileno(),),
            start_new_session=True,  # Ctrl-C reaches the server, which drains and then stops its workers
            env={**os.environ, **WORKER_ENV},
        )
    finally:
        child.close()
    return WorkerProcess(process, await Channel.open(parent))


class WorkerPool:
    def __init__(self, preload: tuple[str, ...], log_level: str, keep_spare: bool):
        self._preload = preload
        self._log_level = log_level
        self._keep_spare = keep_spare
        self._spare: asyncio.Task | None = None
        self._closed = False

    async def take(self) -> WorkerProcess:
        """The spare if there is a live one, else a freshly started process."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                process = await spare
                if not process.exited:
                    return process
            except Exception as exc:
                log.warning("the spare worker failed to start: %s", exc)
        return await spawn_worker(self._preload, self._log_level)

    @property
    def spare_state(self) -> str:
        """none | starting (still importing the runtimes) | warm (ready for a load at once)."""
        spare = self._spare
        if spare is None or (spare.done() and (spare.cancelled() or spare.exception() is not None)):
            return "none"
        return "warm" if spare.done() else "starting"

    def refill(self) -> None:
        """Start a new spare if none is waiting (call when no load is running)."""
        if self._keep_spare and self._spare is None and not self._closed:
            self._spare = asyncio.create_task(self._start_spare(), name="spare-worker")

    async def _start_spare(self) -> WorkerProcess:
        """A spare is ready once it greets with "idle": its runtimes are imported."""
        process = await spawn_worker(self._preload, self._log_level)
        await process.channel.recv()
        return process

    async def close(self) -> None:
        self._closed = True
        spare, self._spare = self._spare, None
        if spare is not None:
            with contextlib.suppress(Exception):
                await (await spare).kill()
