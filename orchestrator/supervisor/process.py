"""Starting a worker process: `python -m orchestrator.worker` on an inherited Unix socket.

The process imports the backends' runtimes it is told to preload, greets with "idle" and waits for a
"load" message; supervisor/pool.py keeps one such spare ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from dataclasses import dataclass

from orchestrator.ipc.channel import Channel
from orchestrator.ipc.handoff import Handoff

log = logging.getLogger(__name__)

# Weights come only from engine folders: a worker never reaches for a model hub.
WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    channel: Channel
    handoff: Handoff | None = None  # where client sockets go to the worker (attached streams)

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
        if self.handoff is not None:
            self.handoff.close()


async def spawn_worker(preload: tuple[str, ...], log_level: str) -> WorkerProcess:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours, their_handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # client sockets go over it
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "orchestrator.worker", "--fd", str(child.fileno()), "--handoff-fd",
            str(their_handoff.fileno()), "--preload", ",".join(preload), "--log-level", log_level,
            pass_fds=(child.fileno(), their_handoff.fileno()),
            start_new_session=True,  # Ctrl-C reaches the server, which drains and then stops its workers
            env={**os.environ, **WORKER_ENV},
        )
    finally:
        child.close()
        their_handoff.close()
    return WorkerProcess(process, await Channel.open(parent), Handoff(ours))
