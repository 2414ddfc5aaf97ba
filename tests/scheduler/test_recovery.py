"""Recovering from crashes, in-process on virtual time: a crashed model is `unloaded` at once (or `failed`
only while crashes in a row back off, then `unloaded` again by itself); a pinned model is reloaded by itself;
requests that meet a crash or a load in progress get an answer within the queue timeout, with Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.errors import ModelUnavailable, WorkerCrashed
from tests.fakes.clock import run_virtual, until
from tests.scheduler.harness import advance, inference_request, make_scheduler, model, serve

PINNED = "[models.alpha]\npinned = true\n"


async def answered(scheduler, workers, model: str = "alpha"):
    task = asyncio.create_task(serve(scheduler, inference_request(model)))
    worker, engine_request = await workers.next_submit()
    worker.finish(engine_request.id)
    return await task


async def crash_during_a_request(scheduler, workers):
    task = asyncio.create_task(serve(scheduler, inference_request("alpha")))
    worker, _ = await workers.next_submit()
    worker.crash()
    with pytest.raises(WorkerCrashed) as crashed:
        await task
    return crashed.value


def test_crashes_in_a_row_back_off_as_failed_then_the_model_is_unloaded_by_itself(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2)
        first = await crash_during_a_request(scheduler, workers)
        after_first = model(scheduler, "alpha").state, first.retry_after_s
        second = await crash_during_a_request(scheduler, workers)  # reloaded at once, crashed again
        after_second = model(scheduler, "alpha").state, second.retry_after_s, model(scheduler, "alpha").retry_in_s
        with pytest.raises(ModelUnavailable, match="is failing") as refused:
            await serve(scheduler, inference_request("alpha"))
        await advance(1.0)  # the backoff ends: no request needed to leave `failed`
        after_backoff = model(scheduler, "alpha").state, len(workers.started)
        await answered(scheduler, workers)
        return after_first, after_second, refused.value.retry_after_s, after_backoff, model(scheduler, "alpha").state

    after_first, after_second, refused_retry, after_backoff, final = run_virtual(go())
    assert after_first == ("unloaded", 1.0)  # retried at once; the client hears "in a second"
    assert after_second == ("failed", pytest.approx(1.0), pytest.approx(1.0))
    assert refused_retry == pytest.approx(1.0)
    assert after_backoff == ("unloaded", 2)  # no load was tried meanwhile
    assert final == "ready"


def test_a_pinned_model_that_crashes_is_loaded_again_by_itself(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1}, 2, PINNED)
        await scheduler.start()
        workers.of("alpha")[-1].crash()
        await until(lambda: model(scheduler, "alpha").state == "ready" and len(workers.started) == 2,
                    "the pinned model to be reloaded")
        return scheduler.ready, events.log

    ready, log = run_virtual(go())
    assert ready and log == [("loaded", "alpha"), ("crashed", "alpha"), ("loaded", "alpha")]


def test_a_pinned_model_whose_reloads_fail_keeps_trying_with_backoff(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2, PINNED)
        await scheduler.start()
        for _ in range(3):
            workers.fail_next_load("alpha", ModelUnavailable("the engine would not start"))
        workers.of("alpha")[-1].crash()
        loop = asyncio.get_running_loop()
        crashed_at = loop.time()
        await until(lambda: len(workers.started) == 2, "the first reload")
        tries = []
        while model(scheduler, "alpha").state != "ready":
            await advance(0.25)
            tries.append((len(workers.started), model(scheduler, "alpha").state, scheduler.ready))
        return loop.time() - crashed_at, len(workers.started), tries[0]

    took, started, first = run_virtual(go())
    # the crash is retried at once; the three reloads that fail back off 1, 2 and 4 s before the one that works
    assert started == 5 and took == pytest.approx(7.0, abs=0.3)
    assert first == (2, "failed", False)  # not ready while a pinned model is down


def test_a_request_waits_for_a_load_in_progress_at_most_the_queue_timeout(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2, queue_timeout_s=5)
        release = workers.hold_loads("alpha")
        loop = asyncio.get_running_loop()
        asked = loop.time()
        first = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        await until(lambda: model(scheduler, "alpha").state == "loading", "the load to begin")
        with pytest.raises(ModelUnavailable, match=r"model 'alpha' is still loading \(waited 5 s\)") as refused:
            await serve(scheduler, inference_request("alpha"))
        waited = loop.time() - asked
        with pytest.raises(ModelUnavailable):
            await first
        release.set()
        await answered(scheduler, workers)  # the load itself went on
        return waited, refused.value.retry_after_s

    waited, retry_after = run_virtual(go())
    assert waited == pytest.approx(5.0, abs=0.01) and retry_after == 5.0


def test_draining_stops_pinned_reloads(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1}, 2, PINNED)
        await scheduler.start()
        scheduler.begin_drain()
        workers.of("alpha")[-1].crash()
        await advance(5)
        return len(workers.started), model(scheduler, "alpha").state

    assert run_virtual(go()) == (1, "unloaded")
