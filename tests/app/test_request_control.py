"""The real app in-process steering requests: a client that goes away cancels its engine requests, a full
queue answers 429 with Retry-After, and a shutdown drains (queued requests turned away, running ones
finish) before the workers stop."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.engine.request import FinishReason
from tests.app.harness import running_app, sse_events
from tests.fakes.clock import until

HI = [{"role": "user", "content": "Say hello."}]
ONE_AT_A_TIME = ("--scheduling.max-concurrency", "1")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_that_goes_away_cancels_its_request_in_the_worker(catalogue, stream):
    async def go():
        async with running_app(catalogue) as app:
            body = {"model": app.model, "messages": HI, "stream": stream, "n": 2}
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, first = await app.workers.next_submit()
            _, second = await app.workers.next_submit()
            worker.emit(first.id, "Hello", tokens=1)
            worker.emit(second.id, "Hi", tokens=1, finish=FinishReason.STOP)  # this one is over already
            if stream:
                (await responding).close()  # hang up mid-stream
            else:
                responding.cancel()  # give up waiting for the whole response
            cancelled = await asyncio.wait_for(app.workers.cancels.get(), 30)
            await until(lambda: app.snapshot().running == 0, "the request to be let go")
            return first.id, cancelled, worker.cancelled

    first, cancelled, all_cancelled = asyncio.run(go())
    assert cancelled == first and all_cancelled == [first]  # the finished choice is not cancelled again


def test_a_full_queue_is_a_429_with_retry_after(catalogue):
    async def go():
        async with running_app(catalogue, *ONE_AT_A_TIME, "--scheduling.max-queue", "0") as app:
            body = {"model": app.model, "messages": HI}
            running = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, request = await app.workers.next_submit()
            refused = await app.client.post("/v1/chat/completions", json=body)
            answer = refused.status, refused.headers.get("Retry-After"), await refused.json()
            worker.finish(request.id)
            assert (await running).status == 200
            return answer

    status, retry_after, body = asyncio.run(go())
    assert status == 429 and retry_after == "1"
    assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "queue_full"
    assert "the limit is 0" in body["error"]["message"]


def test_shutdown_drains_queued_requests_away_and_lets_running_ones_finish(catalogue):
    async def go():
        async with running_app(catalogue, *ONE_AT_A_TIME) as app:
            body = {"model": app.model, "messages": HI, "stream": True}
            running = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Still", tokens=1)
            stream = await running
            queued = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            await until(lambda: app.snapshot().queued == 1, "the second request to queue")

            shutting_down = asyncio.create_task(app.client.server.close())  # what SIGTERM starts
            turned_away = await queued
            away = turned_away.status, await turned_away.json()
            assert not shutting_down.done() and not worker.stopped and not app.scheduler.ready
            worker.emit(request.id, " going", tokens=1, finish=FinishReason.STOP)
            raw = await stream.read()
            await shutting_down
            return away, raw, worker.stopped, app.workers.calls

    (status, body), raw, stopped, calls = asyncio.run(go())
    assert status == 503 and body["error"]["code"] == "shutting_down"
    *chunks, done = sse_events(raw)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Still going"
    assert done == "[DONE]"
    assert stopped and calls[-1] == "close"
