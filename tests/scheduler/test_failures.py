"""Failures, in-process on virtual time: a crash fails only the requests in flight and the next request
reloads the model; failures in a row back off (0, 1, 2 ... s), and a request that succeeds resets the count."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.errors import EngineError, ModelUnavailable, WorkerCrashed
from orchestrator.lifecycle import RequestStatus
from tests.fakes.clock import run_virtual
from tests.scheduler.harness import advance, inference_request, make_scheduler, model, serve, served


def test_a_crash_during_a_request_fails_it_and_the_next_request_reloads_the_model(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 2)
        await served(scheduler, workers, "beta")
        request = inference_request("alpha", n=2)
        task = asyncio.create_task(serve(scheduler, request))
        worker, _ = await workers.next_submit()
        await workers.next_submit()
        worker.crash()
        with pytest.raises(WorkerCrashed, match="exited \\(killed by SIGKILL\\) while running this request"):
            await task
        alpha, beta = model(scheduler, "alpha"), model(scheduler, "beta")
        crashed = (alpha.state, alpha.crashes, alpha.running, beta.state)
        reply = await served(scheduler, workers)  # at once: a first failure is retried without delay
        return crashed, reply.status, model(scheduler, "alpha").state, len(workers.of("alpha")), events.log

    crashed, status, state, alpha_workers, log = run_virtual(go())
    assert crashed == ("unloaded", 1, 0, "ready")  # a first crash: retried at once; beta untouched
    assert status is RequestStatus.FINISHED_STOPPED and state == "ready" and alpha_workers == 2
    assert log == [("loaded", "beta"), ("loaded", "alpha"), ("crashed", "alpha"), ("loaded", "alpha")]


def test_failures_in_a_row_back_off_and_a_request_that_succeeds_resets_the_count(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2)
        for _ in range(2):
            workers.fail_next_load("alpha", EngineError("loading the engine failed: boom"))
            with pytest.raises(ModelUnavailable, match="model 'alpha' failed to load: loading the engine failed"):
                await serve(scheduler, inference_request("alpha"))
        # Two failures in a row: the next attempt waits a second, and requests meanwhile are told so.
        with pytest.raises(ModelUnavailable, match=r"is failing .*boom.*the next attempt is in 1 s") as backing_off:
            await serve(scheduler, inference_request("alpha"))
        tries_while_backing_off = len(workers.started)
        await advance(1)
        await served(scheduler, workers)
        # A crash after a success is a first failure again: retried at once (a count not reset would back off 2 s).
        workers.of("alpha")[-1].crash()
        await served(scheduler, workers)
        return backing_off.value.retry_after_s, tries_while_backing_off, len(workers.started)

    retry_after, tries, started = run_virtual(go())
    assert retry_after == pytest.approx(1.0) and tries == 2
    assert started == 4


def test_a_load_that_succeeds_does_not_reset_the_count_a_request_that_fails_keeps_it(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2)
        backoffs = []
        for _ in range(3):  # load, then crash during the request: three failures in a row
            task = asyncio.create_task(serve(scheduler, inference_request("alpha")))
            worker, _ = await workers.next_submit()
            worker.crash()
            with pytest.raises(WorkerCrashed):
                await task
            backoffs.append(model(scheduler, "alpha").retry_in_s)  # None: not failed, retried at once
            await advance(backoffs[-1] or 0.0)
        return backoffs, model(scheduler, "alpha").load_failures

    # the backoff grows with each crash (1, 2 s): the loads between them did not reset the count
    assert run_virtual(go()) == ([None, pytest.approx(1.0), pytest.approx(2.0)], 0)
