"""The stall policy: judged from the write buffer and the bytes handed over, on the watch's own timer (virtual
time here). A slow client that keeps taking bytes is never cut off; one that takes nothing for a whole
period while output waits is, once."""

from __future__ import annotations

import asyncio

from orchestrator.api.stall import Progress, StallWatch, judge
from tests.fakes.clock import run_virtual


def test_judge():
    assert judge(0, 100, 100) is Progress.DRAINED
    assert judge(10, 100, 101) is Progress.MOVING
    assert judge(10, 100, 100) is Progress.STALLED


class Transport:
    """The part of an asyncio transport the watch reads: its write buffer."""

    def __init__(self):
        self.buffered = 0
        self.aborted = 0

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.aborted > 0

    def abort(self) -> None:
        self.aborted += 1


def test_a_slow_reader_is_kept_and_a_stalled_one_is_cut_off_once():
    async def go():
        transport, stalls, handed = Transport(), [], [0]
        StallWatch(transport, 1.0, stalls.append, lambda: handed[0])  # its own timer keeps it looking
        for _ in range(5):  # every period the client takes 1 of 100 new bytes: slow, but reading
            handed[0] += 100
            transport.buffered += 99
            await asyncio.sleep(1.0)
        kept = transport.aborted
        handed[0] += 100
        transport.buffered += 100  # from here on it takes nothing
        await asyncio.sleep(3.0)
        return kept, transport.aborted, stalls, transport.buffered

    kept, aborted, stalls, buffered = run_virtual(go())
    assert kept == 0 and aborted == 1 and stalls == [buffered]


def test_a_stopped_watch_never_acts():
    async def go():
        transport = Transport()
        watch = StallWatch(transport, 1.0, lambda _: None, lambda: 10)
        transport.buffered = 10
        watch.stop()
        await asyncio.sleep(5.0)
        return transport.aborted

    assert run_virtual(go()) == 0
