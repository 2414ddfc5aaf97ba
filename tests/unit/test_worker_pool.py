"""The spare-worker refill policy (supervisor/pool.py), on virtual time, with processes that start at once."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.supervisor.pool import QUIET_BEFORE_REFILL_S, WorkerPool, refill_mode
from tests.fakes.clock import run_virtual


class _Greeting:
    async def recv(self) -> dict:
        return {"kind": "idle", "pid": 4242}


class _Process:
    """Stands for a WorkerProcess whose runtimes are imported: it greets at once."""

    exited = False
    channel = _Greeting()

    async def kill(self) -> None:
        self.exited = True


def pool_with(refill: str) -> tuple[WorkerPool, list[_Process]]:
    spawned: list[_Process] = []

    async def spawn() -> _Process:
        spawned.append(_Process())
        return spawned[-1]

    return WorkerPool(spawn, keep_spare=True, refill=refill), spawned


async def settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("setting, cores, mode", [
    ("auto", 8, "after-load"), ("auto", 2, "when-idle"), ("when-idle", 64, "when-idle"), ("after-load", 1, "after-load"),
])
def test_the_refill_mode_follows_the_setting_and_the_core_count(setting, cores, mode):
    assert refill_mode(setting, cores) == mode


def test_after_load_a_new_spare_starts_right_after_a_load():
    async def go():
        pool, spawned = pool_with("after-load")
        pool.server_busy()
        pool.load_finished(succeeded=True)
        await settled()
        started_after_load = len(spawned)
        pool.server_quiet()  # a spare is there already: no second one
        await settled()
        state = pool.spare_state
        await pool.close()
        return started_after_load, len(spawned), state, spawned[0].exited

    assert run_virtual(go()) == (1, 1, "warm", True)


def test_when_idle_a_new_spare_waits_for_a_quiet_second():
    async def go():
        pool, spawned = pool_with("when-idle")
        pool.server_busy()
        pool.load_finished(succeeded=True)
        pool.server_quiet()
        await asyncio.sleep(QUIET_BEFORE_REFILL_S / 2)
        pool.server_busy()  # a request arrives within the second: no spare yet
        await asyncio.sleep(QUIET_BEFORE_REFILL_S)
        interrupted = len(spawned)
        pool.server_quiet()
        await asyncio.sleep(QUIET_BEFORE_REFILL_S)
        await settled()
        return interrupted, len(spawned)

    assert run_virtual(go()) == (0, 1)


def test_a_draining_server_starts_no_spare():
    async def go():
        pool, spawned = pool_with("when-idle")
        pool.server_quiet()
        pool.stop_refilling()
        await asyncio.sleep(QUIET_BEFORE_REFILL_S * 2)
        pool.refill()
        await settled()
        return len(spawned), pool.spare_state

    assert run_virtual(go()) == (0, "none")
