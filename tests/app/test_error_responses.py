"""Every error the app answers comes from the one error table, as OpenAI's JSON error: a wrong method, and an
exception nobody expected (logged with its traceback, never sent)."""

from __future__ import annotations

import asyncio
import logging

from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


def test_an_unexpected_exception_is_a_json_500_without_internals(catalogue, caplog):
    async def go():
        async with running_app(catalogue) as app:
            app.workers.submit_error = RuntimeError("secret internals at 0xdeadbeef")
            response = await app.client.post("/v1/chat/completions", json={"model": app.model, "messages": HI})
            answer = response.status, response.headers["Content-Type"], await response.text()
            [cancelled] = app.workers.started[0].cancelled
            return answer, cancelled, app.scheduler.slots[app.model].running

    with caplog.at_level(logging.ERROR, logger="orchestrator.api.app"):
        (status, content_type, text), cancelled, running = asyncio.run(go())
    assert status == 500 and content_type == "application/json"
    assert "secret" not in text and '"code":"internal_error"' in text and '"type":"server_error"' in text
    assert '"message":"internal server error"' in text
    [record] = [r for r in caplog.records if r.name == "orchestrator.api.app"]
    assert "POST /v1/chat/completions" in record.getMessage()
    assert "secret internals at 0xdeadbeef" in record.exc_text  # the traceback is in the log
    assert cancelled.endswith(".0") and running == 0  # the lease still cleaned up


def test_a_wrong_method_is_a_405_from_the_error_table(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.get("/v1/chat/completions")
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 405
    assert body == {"error": {"message": "GET is not allowed on /v1/chat/completions", "type": "invalid_request_error",
                              "param": None, "code": "method_not_allowed"}}


def test_an_unknown_endpoint_is_a_404_from_the_error_table(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.post("/v1/embeddings", json={})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 404 and body["error"]["code"] == "not_found"
    assert body["error"]["message"] == "no such endpoint: POST /v1/embeddings"
