"""Streams whose client stopped reading: cut off, so that their permits go to others.

A client that stops reading lets the kernel's socket buffer fill, then the transport's write buffer; the
handler then waits in its write for as long as the connection stays open, holding its permit. The
policy: every `http.stall_timeout_s` the watch looks at the connection; if output waits in the transport's
write buffer and not one byte of it left since the last look, the client is stalled and the connection is
aborted. (A client that stops reading is cut off one to two periods later.) The handler's write then fails
or its task is cancelled, which ends the request as a client that went away: its engine requests are
cancelled and its permit is handed on.

`StallWatch` does not care how the stream is written: it asks the writer how many bytes it has handed over
so far (`handed`, read once per look, so a write costs the watch nothing), and the watch's own timer does the
looking, so it acts even while the writer waits in a write. The decision itself is `judge`, a pure function.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum

from aiohttp import web

from orchestrator.api.record import record_of
from orchestrator.api.state import STATE

log = logging.getLogger(__name__)


class Progress(Enum):
    DRAINED = "drained"  # nothing waits in the write buffer
    MOVING = "moving"  # output waits, but the client took some since the last look
    STALLED = "stalled"  # output waits and the client took nothing since the last look


def judge(buffered: int, delivered_before: int, delivered_now: int) -> Progress:
    """`buffered`: bytes waiting in the write buffer now; `delivered`: bytes handed over minus bytes still
    buffered, at the last look and now (it grows exactly when bytes leave the buffer)."""
    if buffered == 0:
        return Progress.DRAINED
    return Progress.MOVING if delivered_now > delivered_before else Progress.STALLED


class StallWatch:
    def __init__(self, transport: asyncio.WriteTransport, period_s: float, on_stall: Callable[[int], None],
                 handed: Callable[[], int]):
        """Looks every `period_s` from now until `stop`; `on_stall(buffered_bytes)` is called once, just before
        the transport is aborted. `handed()`: the bytes the writer has handed the transport so far."""
        self._transport = transport
        self._period_s = period_s
        self._on_stall = on_stall
        self._handed = handed
        self._delivered_at_look = 0
        self._timer: asyncio.TimerHandle | None = None
        self._look_later()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _delivered(self, buffered: int) -> int:
        return self._handed() - buffered

    def _look_later(self) -> None:
        self._delivered_at_look = self._delivered(self._transport.get_write_buffer_size())
        self._timer = asyncio.get_running_loop().call_later(self._period_s, self._look)

    def _look(self) -> None:
        self._timer = None
        if self._transport.is_closing():
            return
        buffered = self._transport.get_write_buffer_size()
        if judge(buffered, self._delivered_at_look, self._delivered(buffered)) is Progress.STALLED:
            self._on_stall(buffered)
            self._transport.abort()
        else:
            self._look_later()


def watch_stalls(http: web.Request, handed: Callable[[], int]) -> StallWatch:
    """A StallWatch on the request's connection (`http.stall_timeout_s`), stopped when the calling handler's
    task ends (a kept-alive connection's next request gets a watch of its own); `handed()` says how many bytes the
    response's writer has handed the transport so far. Raises ConnectionResetError
    if the connection is gone already."""
    transport = http.transport
    if transport is None:
        raise ConnectionResetError("the client went away")
    period_s = http.app[STATE].config.http.stall_timeout_s
    request_id = record_of(http).id

    def on_stall(buffered: int) -> None:
        log.warning("request %s: the client read nothing for %g s with %d bytes waiting; ending its stream",
                    request_id, period_s, buffered)

    watch = StallWatch(transport, period_s, on_stall, handed)
    asyncio.current_task().add_done_callback(lambda _: watch.stop())
    return watch
