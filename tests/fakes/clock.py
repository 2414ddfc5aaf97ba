"""An event loop on virtual time: whenever every task waits, its clock jumps straight to the next timer.

Timeouts, backoffs and keep-alives then take no real time, and fire in an order fixed by their deadlines
alone, so tests of them are fast and deterministic. `loop.time()` is the clock; give it to the code under
test (the scheduler's `clock`) so that both read the same time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine

# Timers closer together than this fire in the same loop iteration (asyncio's own rule), in deadline order.
RESOLUTION_S = 1e-3
# With no timer pending only another thread can wake the loop; if none does in this long, nothing can happen.
DEADLOCK_S = 10.0


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop):
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        if timeout is None:
            events = super().select(DEADLOCK_S)
            if not events:
                raise RuntimeError("deadlock: every task waits and no timer is pending")
            return events
        events = super().select(0)
        if not events and timeout > 0:
            self._loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        self._now = 0.0
        super().__init__(_JumpingSelector(self))
        self._clock_resolution = RESOLUTION_S

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run_virtual(main: Coroutine):
    """asyncio.run on virtual time."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)


async def until(condition, what: str = "the condition", turns: int = 1000) -> None:
    """Let other tasks run (no time passes) until `condition()` holds; fail if it never does."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what} did not come about")
