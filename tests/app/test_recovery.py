"""After a worker crash, in-process: the request in flight gets 503 with Retry-After; /ready stays truthful
(the model is `unloaded`, listed as failing with the reason) and the next request loads the model again."""

from __future__ import annotations

import asyncio

from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


def test_a_crash_answers_503_with_retry_after_and_ready_names_the_failing_model(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            body = {"model": app.model, "messages": HI}
            asking = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, _ = await app.workers.next_submit()
            worker.crash()
            crashed = await asking
            ready = await app.client.get("/ready")
            ready_body = await ready.json()
            again = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, request = await app.workers.next_submit()
            worker.finish(request.id)
            answered = (await again).status
            after = await (await app.client.get("/ready")).json()
            return (crashed.status, crashed.headers.get("Retry-After"), await crashed.json(), ready.status,
                    ready_body, answered, after, app.model)

    status, retry_after, body, ready, ready_body, answered, after, model = asyncio.run(go())
    assert status == 503 and retry_after == "1" and body["error"]["code"] == "worker_crashed"
    assert ready == 200 and ready_body["models"] == {model: "unloaded"}
    assert ready_body["failing"] == {
        model: {"state": "unloaded", "error": "the worker process exited unexpectedly", "retry_in_s": None}
    }
    assert answered == 200 and after["models"] == {model: "ready"} and after["failing"] == {}
