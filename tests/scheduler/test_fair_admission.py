"""Admission between API keys in-process, on virtual time: a key's flood fills only its own share of the queue,
the next free permit goes to the key below its share, a permit is kept free for a key between its requests (and
given to the flood once that key is gone), and keys are charged the tokens they are served."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.errors import QueueFull
from orchestrator.scheduler.fairness import Tenant
from orchestrator.scheduler.settings import Priority
from tests.fakes.clock import run_virtual, until
from tests.scheduler.harness import inference_request, make_admission

SMALL = """
[models.alpha]
max_concurrency = 2
max_queue = 4
"""
A, B = Tenant("a"), Tenant("b")
NOW = Priority.INTERACTIVE


async def flood(admission, entry, tenant: Tenant, count: int) -> list[asyncio.Task]:
    """`count` requests of `tenant`, each taking a permit or waiting for one."""
    tasks = []
    for _ in range(count):
        request = inference_request("alpha")
        tasks.append(asyncio.create_task(admission.acquire(entry, NOW, tenant, request)))
        await asyncio.sleep(0)
    return tasks


def test_a_keys_flood_is_refused_at_its_share_while_another_key_still_queues(tmp_path):
    async def go():
        admission, entry = make_admission(tmp_path, SMALL)
        await flood(admission, entry, A, 2 + 4)  # both permits, then the whole queue
        await until(lambda: entry.queued == 4)
        with pytest.raises(QueueFull, match="the limit is 4"):  # a alone: the model's bound, as without keys
            await admission.acquire(entry, NOW, A, inference_request("alpha"))
        b = await flood(admission, entry, B, 2)  # b is below its share (2 of 4): it queues
        await until(lambda: entry.queued == 6)
        with pytest.raises(QueueFull, match="key 'a' holds 4 of them, its share \\(2\\)"):
            await admission.acquire(entry, NOW, A, inference_request("alpha"))
        with pytest.raises(QueueFull, match="key 'b' holds 2 of them, its share \\(2\\)"):
            await admission.acquire(entry, NOW, B, inference_request("alpha"))
        for task in b:
            task.cancel()
        await asyncio.gather(*b, return_exceptions=True)
        return entry.queued

    assert run_virtual(go()) == 4


def test_the_next_free_permit_goes_to_the_key_that_waits_behind_a_flood(tmp_path):
    async def go():
        admission, entry = make_admission(tmp_path, SMALL)
        a = await flood(admission, entry, A, 2 + 3)
        await until(lambda: entry.queued == 3)
        b_request = inference_request("alpha")
        b = asyncio.create_task(admission.acquire(entry, NOW, B, b_request))
        await until(lambda: entry.queued == 4)
        first = next(iter(entry.shares._serving["a"].values()))  # the first of a's requests served
        admission.release(entry, A, first)  # one of a's permits frees: b's waiter arrived last, and goes first
        await b
        return entry.shares.running("b"), entry.shares.running("a"), entry.queued, len(a)

    assert run_virtual(go()) == (1, 1, 3, 5)


def test_keys_are_charged_as_they_are_served_and_by_weight(tmp_path):
    async def go():
        admission, entry = make_admission(tmp_path, SMALL)
        heavy, light = Tenant("heavy", weight=2.0), Tenant("light")
        one, two = inference_request("alpha"), inference_request("alpha")  # 3 prompt tokens each
        await admission.acquire(entry, NOW, heavy, one)
        await admission.acquire(entry, NOW, light, two)
        one.choices[0].completion_tokens = 10  # served so far, before either ends
        two.choices[0].completion_tokens = 10
        live = entry.shares.counter("heavy"), entry.shares.counter("light")
        admission.release(entry, heavy, one)
        settled = entry.shares.counter("heavy")
        return live, settled

    (heavy, light), settled = run_virtual(go())
    assert heavy == (3 + 2 * 10) / 2  # a prompt token counts 1, a generated one 2; weight 2 halves it
    assert light == 3 / 2 + (3 + 2 * 10)  # arrived with heavy active: lifted to heavy's counter, then charged
    assert settled == heavy


def test_a_key_that_returns_is_lifted_to_the_active_keys_counter(tmp_path):
    async def go():
        admission, entry = make_admission(tmp_path, SMALL)
        request = inference_request("alpha")
        await admission.acquire(entry, NOW, A, request)
        request.choices[0].completion_tokens = 100
        await admission.acquire(entry, NOW, B, inference_request("alpha"))  # b arrives idle: lifted to a's counter
        return entry.shares.counter("a"), entry.shares.counter("b") - 3

    assert run_virtual(go()) == (3 + 200, 3 + 200)  # lifted to a's counter as served so far; then its own prompt


def test_a_permit_is_kept_for_a_key_between_its_requests_and_given_away_once_it_is_gone(tmp_path):
    async def go():
        admission, entry = make_admission(tmp_path, SMALL, key_presence_s=5.0)
        loop = asyncio.get_running_loop()
        b_request = inference_request("alpha")
        await admission.acquire(entry, NOW, B, b_request)
        admission.release(entry, B, b_request)  # b is between two requests
        a = await flood(admission, entry, A, 2)  # a's first runs (its share is one of two); its second waits
        await until(lambda: entry.queued == 1)
        kept = entry.running, entry.queued
        start = loop.time()
        b_next = inference_request("alpha")
        await admission.acquire(entry, NOW, B, b_next)  # b's next request runs at once: the permit was kept
        served_b = entry.shares.running("b")
        admission.release(entry, B, b_next)
        await asyncio.gather(*a)  # once b is gone (5 s after its last request), a takes the permit
        return kept, served_b, entry.shares.running("a"), loop.time() - start

    kept, served_b, running_a, waited = run_virtual(go())
    assert kept == (1, 1)
    assert served_b == 1
    assert running_a == 2
    assert 5.0 <= waited < 6.0


def test_one_keys_admissions_do_not_sum_its_running_requests_and_two_keys_do(tmp_path):
    """Counters are only compared between keys: while one key is alone on the model its admissions leave its
    running requests' tokens unread (a pass over all of them per admission); once another key comes, they count."""
    reads = []

    class Watched:
        prompt_tokens = 3

        @property
        def completion_tokens(self) -> int:
            reads.append(self)
            return 10

    async def go():
        admission, entry = make_admission(tmp_path, SMALL.replace("max_concurrency = 2", "max_concurrency = 3"))
        await admission.acquire(entry, NOW, A, Watched())
        await admission.acquire(entry, NOW, A, Watched())
        alone = len(reads)
        await admission.acquire(entry, NOW, B, inference_request("alpha"))  # b arrives: lifted to a's counter
        return alone, entry.shares.counter("b")

    alone, lifted = run_virtual(go())
    assert alone == 0
    assert reads and lifted == 2 * (3 + 2 * 10) + 3  # a's two requests as served so far, then b's own prompt
