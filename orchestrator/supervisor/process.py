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
