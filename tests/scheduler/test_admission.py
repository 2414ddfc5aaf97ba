"""Admission in-process, on virtual time: the races at a waiter's deadline, and one load shared by every
request that waits for it."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.errors import ModelUnavailable, QueueFull
from orchestrator.scheduler.settings import Priority
from tests.fakes.clock import RESOLUTION_S, run_virtual, until
from tests.scheduler.harness import advance, inference_request, make_admission, make_scheduler, model, serve

ONE_AT_A_TIME = """
[models.alpha]
max_concurrency = 1
"""
TIMEOUT_S = 10.0


def test_a_waiter_granted_just_as_it_times_out_runs(tmp_path):
    """The permit frees in the same loop iteration as the waiter's deadline, just before it: granted wins."""

    async def go():
        admission, entry = make_admission(tmp_path, ONE_AT_A_TIME, queue_timeout_s=TIMEOUT_S)
        loop = asyncio.get_running_loop()
        await admission.acquire(entry, Priority.INTERACTIVE)  # the first request holds the only permit
        deadline = loop.time() + TIMEOUT_S
        waiter = asyncio.create_task(admission.acquire(entry, Priority.INTERACTIVE))
        await until(lambda: entry.queued == 1)
        loop.call_at(deadline - RESOLUTION_S / 2, admission.release, entry)
        await waiter  # granted: no ModelUnavailable
        return entry.running, entry.queued, loop.time() - deadline

    running, queued, late = run_virtual(go())
    assert (running, queued) == (1, 0)
    assert abs(late) < RESOLUTION_S  # it really was the deadline's iteration


def test_a_waiter_that_times_out_just_before_the_grant_passes_the_permit_to_the_next(tmp_path):
    async def go():
        admission, entry = make_admission(tmp_path, ONE_AT_A_TIME, queue_timeout_s=TIMEOUT_S)
        loop = asyncio.get_running_loop()
        await admission.acquire(entry, Priority.INTERACTIVE)
        deadline = loop.time() + TIMEOUT_S
        first = asyncio.create_task(admission.acquire(entry, Priority.INTERACTIVE))
        await until(lambda: entry.queued == 1)
        await advance(1.0)  # the second waiter's deadline comes a second later
        second = asyncio.create_task(admission.acquire(entry, Priority.INTERACTIVE))
        await until(lambda: entry.queued == 2)
        loop.call_at(deadline + RESOLUTION_S / 4, admission.release, entry)  # same iteration, after the deadline
        with pytest.raises(ModelUnavailable, match="stayed busy for 10 s") as refused:
            await first
        await second
        return refused.value.retry_after_s, entry.running, entry.queued

    retry_after, running, queued = run_virtual(go())
    assert retry_after == 5.0
    assert (running, queued) == (1, 0)  # the permit went to the second waiter, not lost


def test_a_waiter_cancelled_after_its_grant_passes_the_permit_on(tmp_path):
    """The client goes away in the same iteration as its request is granted a permit, before it could run."""

    async def go():
        admission, entry = make_admission(tmp_path, ONE_AT_A_TIME)
        await admission.acquire(entry, Priority.INTERACTIVE)
        first = asyncio.create_task(admission.acquire(entry, Priority.INTERACTIVE))
        second = asyncio.create_task(admission.acquire(entry, Priority.INTERACTIVE))
        await until(lambda: entry.queued == 2)
        admission.release(entry)  # grants the first waiter ...
        first.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        return entry.running, entry.queued

    assert run_virtual(go()) == (1, 0)


def test_a_full_queue_is_a_429_with_retry_after(tmp_path):
    async def go():
        settings = ONE_AT_A_TIME + "max_queue = 1\n"
        admission, entry = make_admission(tmp_path, settings)
        await admission.acquire(entry, Priority.INTERACTIVE)
        waiting = asyncio.create_task(admission.acquire(entry, Priority.INTERACTIVE))
        await until(lambda: entry.queued == 1)
        with pytest.raises(QueueFull, match="has 1 requests queued \\(the limit is 1\\)") as refused:
            await admission.acquire(entry, Priority.INTERACTIVE)
        waiting.cancel()
        return refused.value.retry_after_s

    assert run_virtual(go()) == 1.0


def test_concurrent_requests_for_an_unloaded_model_share_one_load(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1}, 2)
        release_load = workers.hold_loads("alpha")
        requests = [inference_request("alpha") for _ in range(5)]
        tasks = [asyncio.create_task(serve(scheduler, r)) for r in requests]
        await until(lambda: model(scheduler, "alpha").queued == 5 and workers.started,
                    "every request holding a permit while the model loads")
        [snapshot] = scheduler.snapshot()
        assert (snapshot.state, snapshot.running, snapshot.queued) == ("loading", 0, 5)
        assert len(workers.started) == 1
        release_load.set()
        for _ in requests:
            worker, engine_request = await workers.next_submit()
            worker.finish(engine_request.id)
        await asyncio.gather(*tasks)
        return len(workers.started), model(scheduler, "alpha").loads, events.log

    started, loads, log = run_virtual(go())
    assert started == loads == 1
    assert log == [("loaded", "alpha")]
