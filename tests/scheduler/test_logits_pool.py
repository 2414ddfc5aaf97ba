"""The generation logits pool of a TensorRT-LLM model with `generation_logits` on, on virtual time: held in the
ledger's pinned host RAM while the model is loaded (and refused when the host cannot hold it), drawn from by each
top_logprobs request at admission and given back on every way a request ends, a request larger than the pool
refused naming max_tokens, and one that does not fit now waiting in the queue until a running one gives back."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.engine.request import FinishReason
from orchestrator.errors import InvalidRequest, ModelUnavailable, WorkerCrashed
from tests.fakes.clock import run_virtual, until
from tests.scheduler.harness import GIB, advance, inference_request, make_scheduler, model, serve

VOCAB = 1000  # padded to itself (one GPU): 4,000 bytes of fp32 logits per generated token
PER_TOKEN = VOCAB * 4
DRAW = 8 * PER_TOKEN  # one choice of 8 new tokens
POOL = 2 * DRAW  # room for two such choices at a time
SETTINGS = f"[models.alpha]\ngeneration_logits = true\ngeneration_logits_bytes = {POOL}\n"


def pool_of(scheduler) -> tuple[int, int]:
    pool = model(scheduler, "alpha").generation_logits_pool
    return pool.size_bytes, pool.used_bytes


def logits_scheduler(tmp_path, settings: str = SETTINGS, host_gib: float = 1024, **scheduling):
    return make_scheduler(tmp_path, {"alpha": 1}, 2, settings, backend="trtllm", host_gib=host_gib, vocab_size=VOCAB,
                          **scheduling)


def test_the_pool_is_held_in_host_ram_while_the_model_is_loaded(tmp_path):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path)
        before = scheduler.memory().host_used_bytes
        task = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        worker, engine_request = await workers.next_submit()
        loaded = scheduler.memory().host_used_bytes, worker.spec.options
        worker.finish(engine_request.id)
        await task
        await scheduler.unload("alpha")
        return before, loaded, scheduler.memory().host_used_bytes, pool_of(scheduler)

    before, (held, options), after, pool = run_virtual(go())
    assert (before, held, after) == (0, POOL, 0)
    assert options.generation_logits and not options.prompt_cache_bytes  # the pool is no host KV tier
    assert pool == (POOL, 0)


def test_the_default_pool_holds_one_choice_of_the_longest_sequence(tmp_path):
    async def go():
        scheduler, _, _ = logits_scheduler(tmp_path, "[models.alpha]\ngeneration_logits = true\n")
        return pool_of(scheduler)

    assert run_virtual(go()) == (200 * PER_TOKEN, 0)  # the made-up engines' max_seq_len


def test_a_model_without_the_setting_has_no_pool(tmp_path):
    async def go():
        scheduler, _, _ = logits_scheduler(tmp_path, "")
        return model(scheduler, "alpha").generation_logits_pool

    assert run_virtual(go()) is None


def test_a_pool_the_host_cannot_hold_is_refused_by_placement(tmp_path):
    settings = f"[models.alpha]\ngeneration_logits = true\ngeneration_logits_bytes = {3 * GIB}\n"

    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path, settings, host_gib=2)
        with pytest.raises(ModelUnavailable, match=r"3\.00 GiB of pinned host RAM and the host offers 2\.00 GiB"):
            await serve(scheduler, inference_request("alpha"))
        return workers.started

    assert run_virtual(go()) == []


async def running(scheduler, workers, n: int = 1):
    """A top_logprobs request of `n` choices, submitted to the engine: its task, worker and first engine request
    (`finish_all` ends them all)."""
    task = asyncio.create_task(serve(scheduler, inference_request("alpha", n=n, top_logprobs=2)))
    submits = [await workers.next_submit() for _ in range(n)]
    return task, submits[0][0], submits[0][1]


def finish_all(worker) -> None:
    for request_id in list(worker.sinks):
        worker.finish(request_id)


def test_a_request_draws_at_admission_and_gives_back_when_it_completes(tmp_path):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path)
        task, worker, engine_request = await running(scheduler, workers)
        during = pool_of(scheduler)
        worker.finish(engine_request.id, finish=FinishReason.LENGTH)
        await task
        return during, pool_of(scheduler)

    assert run_virtual(go()) == ((POOL, DRAW), (POOL, 0))


@pytest.mark.parametrize("ending", ["engine error", "worker crash", "client gone"])
def test_a_request_gives_back_its_draw_however_it_ends(tmp_path, ending):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path)
        task, worker, engine_request = await running(scheduler, workers, n=2)
        during = pool_of(scheduler)
        if ending == "engine error":
            worker.emit(engine_request.id, error=InvalidRequest("the engine refused it"))
        elif ending == "worker crash":
            worker.crash()
        else:
            task.cancel()
        with pytest.raises((InvalidRequest, WorkerCrashed, asyncio.CancelledError)):
            await task
        return during, pool_of(scheduler)

    assert run_virtual(go()) == ((POOL, 2 * DRAW), (POOL, 0))


def test_requests_without_top_logprobs_draw_nothing(tmp_path):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path)
        task, worker, _ = await running(scheduler, workers, n=2)  # the whole pool
        plain = asyncio.create_task(serve(scheduler, inference_request("alpha")))
        await workers.next_submit()  # runs at once beside it
        finish_all(worker)
        await asyncio.gather(task, plain)
        return pool_of(scheduler)

    assert run_virtual(go()) == (POOL, 0)


def test_a_request_larger_than_the_pool_is_refused_naming_max_tokens(tmp_path):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path)
        with pytest.raises(InvalidRequest) as refused:
            await serve(scheduler, inference_request("alpha", n=3, top_logprobs=1))
        return refused.value, pool_of(scheduler), workers.started

    error, pool, started = run_virtual(go())
    assert error.param == "max_tokens"
    assert "ask for at most 5 tokens" in error.message  # 2 choices of 8 tokens fit the pool: 3 choices of 5
    assert (pool, started) == ((POOL, 0), [])


def test_a_request_waits_while_the_pool_is_full_then_runs(tmp_path):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path)
        first, worker, _ = await running(scheduler, workers, n=2)
        second = asyncio.create_task(serve(scheduler, inference_request("alpha", top_logprobs=1)))
        await until(lambda: model(scheduler, "alpha").queued == 1, "the second request to queue")
        await advance(5)
        waited = model(scheduler, "alpha").queued, pool_of(scheduler), workers.submits.empty()
        finish_all(worker)
        await first
        _, second_request = await workers.next_submit()  # given the draw the first gave back
        admitted = pool_of(scheduler)
        worker.finish(second_request.id)
        await second
        return waited, admitted, pool_of(scheduler)

    waited, admitted, after = run_virtual(go())
    assert waited == (1, (POOL, 2 * DRAW), True)
    assert (admitted, after) == ((POOL, DRAW), (POOL, 0))


def test_a_request_cancelled_or_timed_out_while_waiting_for_the_pool_never_drew(tmp_path):
    async def go():
        scheduler, workers, _ = logits_scheduler(tmp_path, queue_timeout_s=10.0)
        first, worker, _ = await running(scheduler, workers, n=2)
        gone = asyncio.create_task(serve(scheduler, inference_request("alpha", top_logprobs=1)))
        await until(lambda: model(scheduler, "alpha").queued == 1, "the request to queue")
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        with pytest.raises(ModelUnavailable) as expired:
            await serve(scheduler, inference_request("alpha", top_logprobs=1))
        during = pool_of(scheduler)
        finish_all(worker)
        await first
        return expired.value.message, during, pool_of(scheduler)

    message, during, after = run_virtual(go())
    assert "generation logits pool" in message  # the reason it waited
    assert (during, after) == ((POOL, 2 * DRAW), (POOL, 0))
