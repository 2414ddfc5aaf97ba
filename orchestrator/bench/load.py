"""Load shapes: closed loop (a fixed number of requests in flight) and open loop (requests sent at
scheduled arrival times, whatever is still running). Both time the level, the client's own CPU and how late
its event loop runs (a stalled client reads every stream late: its gaps are not the server's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from orchestrator.bench.record import RequestTiming

Send = Callable[[object], Awaitable[RequestTiming]]
LAG_TICK_S = 0.005  # the client's loop is timed by a timer of this period


@dataclass
class LevelRun:
    records: list[RequestTiming]
    wall_s: float  # first send to last response
    client_cpu_s: float  # CPU of the thread running the event loop (the client) during the level
    send_lag_s: list[float] = field(default_factory=list)  # open loop: how late each request went out
    max_in_flight: int = 0
    stopped: str = "all requests sent"
    loop_lag_s: list[float] = field(default_factory=list)  # how late each LAG_TICK_S timer ran


@contextmanager
def _loop_timed() -> Iterator[list[float]]:
    """While inside: how late this event loop wakes a timer, each LAG_TICK_S (the list, filled as it runs)."""
    lags: list[float] = []

    async def tick() -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            lags.append(max(0.0, time.perf_counter() - start - LAG_TICK_S))

    timer = asyncio.create_task(tick())
    try:
        yield lags
    finally:
        timer.cancel()


async def run_closed(send: Send, prepared: list, concurrency: int, duration_s: float | None = None) -> LevelRun:
    """`concurrency` loops, each sending its next request as soon as its last one ended, until `prepared`
    is used up or (with `duration_s`) no new request starts after the deadline."""
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1 (got {concurrency})")
    pending = iter(prepared)
    records: list[RequestTiming] = []
    cpu0, started = time.thread_time(), time.perf_counter()
    deadline = None if duration_s is None else started + duration_s
    timed_out = False

    async def loop() -> None:
        nonlocal timed_out
        for item in pending:
            if deadline is not None and time.perf_counter() >= deadline:
                timed_out = True
                return
            records.append(await send(item))

    with _loop_timed() as lags:
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu0
    run = LevelRun(records, wall, cpu, max_in_flight=min(concurrency, len(records)), loop_lag_s=lags)
    if duration_s is not None:
        run.stopped = "duration reached" if timed_out else "request budget used up before the duration (--max-requests)"
    return run


async def run_open(send: Send, prepared: list, arrivals: list[float]) -> LevelRun:
    """Send prepared[i] at arrivals[i] seconds from the start, never waiting for earlier requests."""
    records: list[RequestTiming] = []
    lags: list[float] = []
    in_flight = peak = 0
    tasks = set()

    async def one(item: object) -> None:
        nonlocal in_flight
        try:
            records.append(await send(item))
        finally:
            in_flight -= 1

    cpu0, started = time.thread_time(), time.perf_counter()
    with _loop_timed() as loop_lags:
        for item, at in zip(prepared, arrivals, strict=True):
            delay = started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(max(0.0, time.perf_counter() - started - at))
            in_flight += 1
            peak = max(peak, in_flight)
            task = asyncio.create_task(one(item))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu0
    return LevelRun(records, wall, cpu, lags, peak, loop_lag_s=loop_lags)
