"""The embedded response store: SQLite in the server's data directory, its blocking calls on one thread.

Every call runs on the store's own thread (a one-thread executor), in the order the calls were made; the
event loop only waits for the outcome, so a large response being written never holds up other requests.
Serialising to JSON and back happens on that thread too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from orchestrator.errors import StoreUnavailable
from orchestrator.store.database import Bounds, ResponseDatabase
from orchestrator.store.interface import Status, StoredResponse

T = TypeVar("T")
DAY_S = 86400.0


class SqliteResponseStore:
    """The ResponseStore over one SQLite file (see database.py for the file, its checks and its bounds)."""

    def __init__(self, database: ResponseDatabase, executor: ThreadPoolExecutor):
        self._database = database
        self._executor = executor
        self._closed = False

    @classmethod
    async def open(
        cls, path: Path, *, max_age_days: float = 30.0, max_mb: float = 1024.0, clock: Callable[[], float] = time.time
    ) -> SqliteResponseStore:
        """Open (or make) the store at `path`; raises StoreUnavailable if no usable database can be had there."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")
        bounds = Bounds(max_age_s=max_age_days * DAY_S, max_bytes=int(max_mb * 2**20))
        try:
            database = await asyncio.get_running_loop().run_in_executor(
                executor, ResponseDatabase.open, path, bounds, clock
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(database, executor)

    async def put(self, stored: StoredResponse) -> None:
        await self._run(self._database.put, stored)

    async def update(self, id: str, *, status: Status, response: dict) -> bool:
        return await self._run(self._database.update, id, status, response)

    async def get(self, id: str, owner: str) -> StoredResponse | None:
        return await self._run(self._database.get, id, owner)

    async def delete(self, id: str, owner: str) -> bool:
        return await self._run(self._database.delete, id, owner)

    async def conversation(self, id: str, owner: str) -> list[dict] | None:
        stored = await self.get(id, owner)
        return None if stored is None else stored.conversation()

    async def close(self) -> None:
        """Wait for the calls already made, then close the database and end the thread."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._database.close)
        finally:
            self._executor.shutdown(wait=False)

    async def _run(self, call: Callable[..., T], *args) -> T:
        if self._closed:
            raise StoreUnavailable("the response store is closed (the server is shutting down)")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)
