"""Draining, in-process on virtual time: queued and new requests are turned away with ShuttingDown, running
ones finish, then every worker stops; a drain that runs out of time stops the workers anyway."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.engine.request import FinishReason
from orchestrator.errors import ShuttingDown
from orchestrator.lifecycle import RequestStatus
from tests.fakes.clock import run_virtual, until
from tests.scheduler.harness import advance, inference_request, make_scheduler, model, serve

ONE_AT_A_TIME = "[models.alpha]\nmax_concurrency = 1\n"


def test_drain_turns_queued_requests_away_and_lets_running_ones_finish(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1}, 2, ONE_AT_A_TIME)
        running = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        worker, engine_request = await workers.next_submit()
        queued = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        await until(lambda: model(scheduler, "alpha").queued == 1)

        stopping = asyncio.create_task(scheduler.stop(drain_timeout_s=30))
        with pytest.raises(ShuttingDown, match="shutting down"):
            await queued
        with pytest.raises(ShuttingDown, match="takes no new requests"):
            await serve(scheduler, inference_request("alpha"))
        assert not scheduler.ready and not stopping.done() and not worker.stopped

        worker.emit(engine_request.id, "still ")
        worker.finish(engine_request.id, "going", FinishReason.LENGTH)
        finished = await running
        await stopping
        return finished.status, worker.stopped, workers.calls, events.log

    status, stopped, calls, log = run_virtual(go())
    assert status is RequestStatus.FINISHED_LENGTH
    assert stopped and log[-1] == ("unloaded", "alpha", "shutdown")
    assert "stop_refilling" in calls and calls[-1] == "close"


def test_a_drain_that_runs_out_of_time_ends_what_runs_and_stops_the_workers(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2)
        running = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        worker, _ = await workers.next_submit()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await scheduler.stop(drain_timeout_s=30)
        took = loop.time() - began
        with pytest.raises(ShuttingDown, match="drain deadline") as ended:
            await running
        return took, worker.stopped, worker.cancelled, ended.value.retry_after_s

    took, stopped, cancelled, retry_after = run_virtual(go())
    assert took == pytest.approx(30) and stopped
    assert cancelled and retry_after  # cancelled in its engine, and told when to come back


def test_the_scheduler_tells_its_workers_when_the_server_turns_busy_and_quiet(tmp_path):
    """The spare-worker refill policy (supervisor/pool.py) is timed by these calls."""

    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2)
        await scheduler.start()
        task = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        worker, engine_request = await workers.next_submit()
        worker.finish(engine_request.id)
        await task
        await advance(1)
        return workers.calls

    assert run_virtual(go()) == ["refill", "server_busy", "load_finished(True)", "server_quiet"]
