"""Every error the app answers comes from the one error table, as OpenAI's JSON error with the request's id
(also in the X-Request-Id header and the log): a wrong method, an unknown route, a body that is too large
or not JSON, and an exception nobody expected (logged with its traceback, never sent)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from tests.app.harness import running_app
from tests.fakes.clock import until

HI = [{"role": "user", "content": "Say hello."}]


def test_an_unexpected_exception_is_a_json_500_without_internals(catalogue, caplog):
    async def go():
        async with running_app(catalogue) as app:
            app.workers.submit_error = RuntimeError("secret internals at 0xdeadbeef")
            response = await app.client.post("/v1/chat/completions", json={"model": app.model, "messages": HI})
            answer = response.status, response.headers, await response.text()
            [cancelled] = app.workers.started[0].cancelled
            return answer, cancelled, app.snapshot().running

    with caplog.at_level(logging.ERROR, logger="orchestrator.api.error_handling"):
        (status, headers, text), cancelled, running = asyncio.run(go())
    assert status == 500 and headers["Content-Type"] == "application/json"
    assert "secret" not in text and '"code":"internal_error"' in text and '"type":"server_error"' in text
    assert '"message":"internal server error"' in text
    request_id = headers["X-Request-Id"]
    assert request_id.startswith("req_") and f'"request_id":"{request_id}"' in text
    [record] = [r for r in caplog.records if r.name == "orchestrator.api.error_handling"]
    assert "POST /v1/chat/completions" in record.getMessage() and request_id in record.getMessage()
    assert "secret internals at 0xdeadbeef" in record.exc_text  # the traceback is in the log
    assert cancelled.endswith(".0") and running == 0  # the lease still cleaned up


def test_a_wrong_method_is_a_405_from_the_error_table(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.get("/v1/chat/completions")
            return response.status, response.headers["X-Request-Id"], await response.json()

    status, request_id, body = asyncio.run(go())
    assert status == 405
    assert body == {"error": {"message": "GET is not allowed on /v1/chat/completions", "type": "invalid_request_error",
                              "param": None, "code": "method_not_allowed", "request_id": request_id}}


def test_an_unknown_endpoint_is_a_404_from_the_error_table(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.post("/v1/embeddings", json={})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 404 and body["error"]["code"] == "not_found"
    assert body["error"]["message"] == "no such endpoint: POST /v1/embeddings"


def _answers(catalogue, calls, *flags):
    """(status, JSON body) for each (method, path, keyword arguments) call."""
    async def go():
        async with running_app(catalogue, *flags) as app:
            answers = []
            for method, path, kwargs in calls:
                response = await app.client.request(method, path, **kwargs)
                assert response.headers["Content-Type"] == "application/json"
                answers.append((response.status, await response.json()))
            return answers

    return asyncio.run(go())


def test_a_body_that_is_not_json_is_a_415_naming_what_was_sent(catalogue):
    body = '{"model": "m", "messages": []}'
    [(form, form_body), (none, none_body)] = _answers(catalogue, [
        ("POST", "/v1/chat/completions", {"data": body, "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
        ("POST", "/v1/completions", {"data": body.encode(), "skip_auto_headers": ["Content-Type"]}),
    ])
    assert form == none == 415 and form_body["error"]["code"] == "unsupported_media_type"
    assert "Content-Type: application/json (got 'application/x-www-form-urlencoded')" in form_body["error"]["message"]
    assert "(got no Content-Type)" in none_body["error"]["message"]


def test_a_body_over_the_limit_is_a_413_whether_its_length_is_declared_or_not(catalogue):
    big = b'{"model": "m", "prompt": "' + b"x" * 5000 + b'"}'

    async def chunked():
        yield big  # no Content-Length: aiohttp itself stops reading past the limit

    [(declared, declared_body), (streamed, streamed_body)] = _answers(catalogue, [
        ("POST", "/v1/completions", {"data": big, "headers": {"Content-Type": "application/json"}}),
        ("POST", "/v1/completions", {"data": chunked(), "headers": {"Content-Type": "application/json"}}),
    ], "--http.max-body-bytes", "4096")
    assert declared == streamed == 413
    assert declared_body["error"]["code"] == streamed_body["error"]["code"] == "payload_too_large"
    assert declared_body["error"]["message"] == f"the request body has {len(big)} bytes; this server accepts at most 4096"
    assert streamed_body["error"]["message"] == "the request body is larger than this server accepts (4096 bytes)"
    assert streamed_body["error"]["request_id"].startswith("req_")


def test_a_client_gone_mid_request_closes_the_connection_without_an_error_log(catalogue, caplog):
    """What the handler meets when its client hung up (aiohttp raises ConnectionResetError on a closing
    transport): the connection is closed, nothing is written and nothing is logged as an error."""
    async def go():
        async with running_app(catalogue) as app:
            app.workers.submit_error = ConnectionResetError("Cannot write to closing transport")
            body = {"model": app.model, "messages": HI, "stream": True}
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await app.client.post("/v1/chat/completions", json=body)
            await until(lambda: app.snapshot().running == 0, "the request to be let go")
            health = await app.client.get("/health")
            return health.status

    with caplog.at_level(logging.INFO):
        status = asyncio.run(go())
    assert status == 200  # the server goes on serving
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
