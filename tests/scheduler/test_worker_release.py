"""Evicting a model whose worker is released (it becomes the next spare), in-process on virtual time: the memory
is counted free only once the worker says it is back; shutdown still ends the workers. (A worker that does not
answer its release is killed: tests/app/test_worker_frames.py.)"""

from __future__ import annotations

import asyncio

from tests.fakes.clock import run_virtual, until
from tests.scheduler.harness import GIB, advance, make_scheduler, model, served


def test_an_evicted_models_worker_is_released_and_not_ended(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 1.5)
        workers.keeps_released = True
        await served(scheduler, workers, "alpha")
        await served(scheduler, workers, "beta")
        [alpha] = workers.of("alpha")
        return alpha.released, alpha.stopped, model(scheduler, "alpha").state, events.log

    released, stopped, state, log = run_virtual(go())
    assert (released, stopped, state) == (True, False, "unloaded")
    assert log == [("loaded", "alpha"), ("unloaded", "alpha", "evicted"), ("loaded", "beta")]


def test_the_memory_is_counted_free_only_once_the_worker_says_it_is_back(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 1.5)
        workers.keeps_released, workers.release_gate = True, asyncio.Event()
        await served(scheduler, workers, "alpha")
        used_by_alpha = scheduler.memory().used_bytes
        beta = asyncio.create_task(served(scheduler, workers, "beta"))
        await until(lambda: model(scheduler, "alpha").state == "unloading")
        await advance(5)
        during = scheduler.memory().used_bytes, workers.of("beta")
        workers.release_gate.set()
        await beta
        return used_by_alpha, during, scheduler.memory().used_bytes

    used_by_alpha, (used_during, beta_workers), used_after = run_virtual(go())
    assert used_by_alpha == 1 * GIB and used_during == used_by_alpha and beta_workers == []
    assert used_after == 1 * GIB  # beta's, alpha's is gone


def test_shutdown_ends_the_workers_rather_than_releasing_them(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 1.5)
        workers.keeps_released = True
        await served(scheduler, workers, "alpha")
        await scheduler.stop(drain_timeout_s=1)
        [alpha] = workers.of("alpha")
        return alpha.released, alpha.stopped

    assert run_virtual(go()) == (False, True)
