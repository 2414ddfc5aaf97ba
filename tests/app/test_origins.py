"""Browser origins, in-process: off by default (any Origin gets 403, requests without one are untouched); a
configured origin gets CORS headers on its answers, streams included, and answers to its preflights."""

from __future__ import annotations

import asyncio

from tests.app.harness import running_app

PAGE = "https://chat.example.com"
HI = [{"role": "user", "content": "Say hello."}]


def test_without_configured_origins_a_browser_request_is_refused_and_others_are_not(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            browser = await app.client.get("/v1/models", headers={"Origin": PAGE})
            preflight = await app.client.options(
                "/v1/chat/completions", headers={"Origin": PAGE, "Access-Control-Request-Method": "POST"}
            )
            plain = await app.client.get("/v1/models")
            return (browser.status, await browser.json(), preflight.status, plain.status,
                    "Access-Control-Allow-Origin" in browser.headers)

    status, body, preflight, plain, cors_header = asyncio.run(go())
    assert (status, preflight, plain) == (403, 403, 200) and not cors_header
    assert body["error"]["code"] == "origin_not_allowed" and PAGE in body["error"]["message"]


def test_a_configured_origin_gets_preflight_answers_and_cors_headers_on_a_stream(catalogue):
    async def go():
        async with running_app(catalogue, "--http.allowed-origins", PAGE) as app:
            preflight = await app.client.options("/v1/chat/completions", headers={
                "Origin": PAGE, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
            })
            other = await app.client.get("/v1/models", headers={"Origin": "https://evil.example.com"})
            body = {"model": app.model, "messages": HI, "stream": True}
            streaming = asyncio.create_task(app.client.post("/v1/chat/completions", json=body, headers={"Origin": PAGE}))
            worker, request = await app.workers.next_submit()
            worker.finish(request.id, "Hello")
            stream = await streaming
            await stream.read()
            return preflight.status, preflight.headers, other.status, stream.status, stream.headers

    preflight, preflight_headers, other, status, headers = asyncio.run(go())
    assert preflight == 204 and preflight_headers["Access-Control-Allow-Origin"] == PAGE
    assert preflight_headers["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
    assert preflight_headers["Access-Control-Allow-Headers"] == "authorization, content-type, x-stainless-os"
    assert other == 403
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    assert headers["Access-Control-Allow-Origin"] == PAGE and headers["Vary"] == "Origin"
    assert "X-Request-Id" in headers["Access-Control-Expose-Headers"]
