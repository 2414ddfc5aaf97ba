"""The background responses running in this server (background.py starts them), by response id: what cancels
one (`POST /v1/responses/{id}/cancel`, `DELETE`) and what the app's cleanup cancels before the store closes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


class BackgroundResponses:
    """The background responses running in this server, by response id."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task] = {}

    def start(self, response_id: str, work: Awaitable[None]) -> asyncio.Task:
        task = asyncio.create_task(work, name=f"background-{response_id}")
        self._tasks[response_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(response_id, None))
        return task

    async def cancel(self, response_id: str) -> None:
        """Cancel the response's task, if it runs here, and wait until it has kept its final state."""
        task = self._tasks.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        """Cancel every background response still running (the app is being cleaned up)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
