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
    pid = 4242

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


class _Loaded:
    """Stands for a loaded model's WorkerClient: `release` gives its process back when its backend can."""

    def __init__(self, reusable: bool):
        self.process = _Process() if reusable else None
        self.stopped = False

    async def release(self, timeout_s: float):
        return self.process

    async def stop(self, timeout_s: float) -> None:
        self.stopped = True


@pytest.mark.parametrize("spare_before", [False, True])
def test_an_unloaded_models_worker_becomes_the_spare_and_the_next_load_takes_it(spare_before):
    async def go():
        pool, spawned = pool_with("after-load")
        if spare_before:
            pool.refill()
            await settled()
        worker = _Loaded(reusable=True)
        kept = await pool.retire(worker, 1.0, reuse=True)
        await settled()
        taken = await pool._take_process()
        return kept, taken is worker.process, [p.exited for p in spawned]

    kept, took_it, spares = run_virtual(go())
    assert kept and took_it
    assert spares == ([True] if spare_before else [])  # one spare is enough: the one that waited is stopped


@pytest.mark.parametrize("reusable, reuse", [(False, True), (True, False)])
def test_a_worker_that_cannot_give_its_memory_back_or_at_shutdown_exits(reusable, reuse):
    async def go():
        pool, _ = pool_with("after-load")
        worker = _Loaded(reusable)
        kept = await pool.retire(worker, 1.0, reuse=reuse)
        return kept, worker.stopped, pool.spare_state

    kept, stopped, state = run_virtual(go())
    assert not kept and state == "none"
    assert stopped == (not reuse)  # release() itself stops a worker it cannot keep
