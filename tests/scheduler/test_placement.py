"""Making room for a load, in-process on virtual time: evict idle models least recently used first, wait for
busy ones (until the queue timeout), and refuse at once when pinned models hold the memory or the model is
larger than the device."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.errors import ModelUnavailable
from tests.fakes.clock import run_virtual, until
from tests.scheduler.harness import advance, inference_request, make_scheduler, model, serve, served


def test_an_idle_model_is_evicted_least_recently_used_first(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1, "beta": 1, "gamma": 1}, 2)
        await served(scheduler, workers, "alpha")
        await advance(1)
        await served(scheduler, workers, "beta")
        await advance(1)
        await served(scheduler, workers, "alpha")  # alpha is now the more recently used
        await advance(1)
        await served(scheduler, workers, "gamma")
        states = {snapshot.name: snapshot.state for snapshot in scheduler.snapshot()}
        return states, events.log, [w.stopped for w in workers.of("beta")]

    states, log, beta_stopped = run_virtual(go())
    assert states == {"alpha": "ready", "beta": "unloaded", "gamma": "ready"}
    assert ("unloaded", "beta", "evicted") in log and ("unloaded", "alpha", "evicted") not in log
    assert beta_stopped == [True]


def test_a_load_waits_for_a_busy_model_to_go_idle_then_evicts_it(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 1)
        busy = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        alpha_worker, alpha_request = await workers.next_submit()
        waiting = asyncio.create_task(serve(scheduler, inference_request("beta")))
        await advance(5)  # half the queue timeout: beta still waits for room
        assert model(scheduler, "beta").state == "unloaded" and not workers.of("beta")
        [beta_snapshot] = [s for s in scheduler.snapshot() if s.name == "beta"]
        assert beta_snapshot.queued == 1
        alpha_worker.finish(alpha_request.id)  # alpha goes idle: beta's load may evict it now
        await busy
        beta_worker, beta_request = await workers.next_submit()
        beta_worker.finish(beta_request.id)
        await waiting
        return events.log

    assert run_virtual(go()) == [("loaded", "alpha"), ("unloaded", "alpha", "evicted"), ("loaded", "beta")]


def test_a_load_that_cannot_get_room_within_the_queue_timeout_is_refused_with_retry_after(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 1, queue_timeout_s=8)
        busy = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        alpha_worker, alpha_request = await workers.next_submit()
        loop = asyncio.get_running_loop()
        asked = loop.time()
        with pytest.raises(ModelUnavailable, match="busy models hold the memory it needs: alpha") as refused:
            await serve(scheduler, inference_request("beta"))
        waited = loop.time() - asked
        alpha_worker.finish(alpha_request.id)
        await busy
        return refused.value.retry_after_s, waited, model(scheduler, "beta").running

    retry_after, waited, beta_running = run_virtual(go())
    assert retry_after == 5.0 and waited == pytest.approx(8)
    assert beta_running == 0


def test_pinned_models_holding_the_memory_refuse_a_load_at_once(tmp_path):
    async def go():
        pinned = "[models.alpha]\npinned = true\n"
        scheduler, _, _ = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 1, pinned)
        await scheduler.start()  # loads the pinned model
        assert model(scheduler, "alpha").state == "ready"
        loop = asyncio.get_running_loop()
        asked = loop.time()
        with pytest.raises(ModelUnavailable, match=r"pinned models \(alpha\)") as refused:
            await serve(scheduler, inference_request("beta"))
        return refused.value.retry_after_s, loop.time() - asked, model(scheduler, "alpha").state

    retry_after, waited, alpha_state = run_virtual(go())
    assert waited == 0 and retry_after == 5.0
    assert alpha_state == "ready"


def test_a_model_larger_than_the_device_is_refused_outright(tmp_path):
    async def go():
        scheduler, workers, _ = make_scheduler(tmp_path, {"huge": 3}, 2)
        with pytest.raises(ModelUnavailable, match=r"it needs 3\.00 GiB and the device offers 2\.00 GiB") as refused:
            await serve(scheduler, inference_request("huge"))
        return refused.value.retry_after_s, workers.started

    assert run_virtual(go()) == (None, [])


def test_host_kv_tiers_that_would_over_commit_host_ram_evict_an_idle_model_or_are_refused(tmp_path):
    """Pinned host RAM is placed as device memory is: the device has room for both models, the host's 2 GiB
    only for one model's 1.5 GiB tier at a time."""
    tiers = "[defaults]\nprompt_cache_bytes = 1_610_612_736\n[models.huge]\nprompt_cache_bytes = 3_221_225_472\n"

    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1, "beta": 1, "huge": 1}, 8, tiers,
                                                    backend="trtllm", host_gib=2)
        await served(scheduler, workers, "alpha")
        memory = scheduler.memory()
        assert (memory.host_capacity_bytes, memory.host_used_bytes) == (2 * 2**30, 1_610_612_736)
        await served(scheduler, workers, "beta")
        options = [w.spec.options for w in workers.started]
        with pytest.raises(ModelUnavailable, match=r"3\.00 GiB of pinned host RAM and the host offers 2\.00 GiB"):
            await serve(scheduler, inference_request("huge"))
        return events.log, options

    log, options = run_virtual(go())
    assert log == [("loaded", "alpha"), ("unloaded", "alpha", "evicted"), ("loaded", "beta")]
    assert [o.prompt_cache_bytes for o in options] == [1_610_612_736] * 2  # the tier the ledger holds is the one asked


def test_an_idle_model_is_unloaded_after_its_keep_alive(tmp_path):
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1}, 2, "[models.alpha]\nkeep_alive_s = 30\n")
        await served(scheduler, workers, "alpha")
        await advance(29)
        assert model(scheduler, "alpha").state == "ready"
        await advance(2)
        await until(lambda: model(scheduler, "alpha").state == "unloaded")
        return events.log

    assert run_virtual(go()) == [("loaded", "alpha"), ("unloaded", "alpha", "idle")]


def test_a_request_for_a_model_chosen_for_eviction_waits_for_it_to_load_again(tmp_path):
    """The eviction is decided and the victim stops taking requests in one turn of the event loop: a request for
    it that arrives right after the decision (before its worker is told to stop) is never handed to that worker,
    it waits and is served by the model loaded again."""
    async def go():
        scheduler, workers, events = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 1)
        await served(scheduler, workers, "alpha")
        beta = asyncio.create_task(serve(scheduler, inference_request("beta")))
        while model(scheduler, "beta").queued == 0:  # beta holds its permit: its load is decided on its next turn
            await asyncio.sleep(0)
        alpha = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        for _ in range(2):
            worker, engine_request = await workers.next_submit()
            worker.finish(engine_request.id)
        results = await asyncio.gather(beta, alpha, return_exceptions=True)
        return results, events.log, [w.stopped for w in workers.of("alpha")]

    results, log, alpha_stopped = run_virtual(go())
    assert [r.choices[0].error for r in results] == [None, None]
    assert log == [("loaded", "alpha"), ("unloaded", "alpha", "evicted"), ("loaded", "beta"),
                   ("unloaded", "beta", "evicted"), ("loaded", "alpha")]
    assert alpha_stopped == [True, False]


def test_the_served_engine_says_which_models_keep_their_system_prompts(tmp_path):
    """What the HTTP side reads (the model's view) carries the setting, so it counts system prefixes only there."""
    async def go():
        keep = "[models.alpha]\nretain_system_prompt = true\n"
        scheduler, _, _ = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, 4, keep, backend="trtllm")
        return [scheduler.model(name).engine.retain_system_prompt for name in ("alpha", "beta")]

    assert run_virtual(go()) == [True, False]
