"""The event loop never waits on one request: a big body's prompt is rendered and tokenised on a thread while
the loop serves others; a small one's inline. The connection deadlines: a client that never finishes its
request head, and a streaming client that stops reading, are cut off (the latter's permit given back).

Checked by structure, never by timing: where the prompt work ran, and that /health was answered while it
was held on its thread."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import pytest

from tests.app.harness import running_app
from tests.fakes.clock import until

WAIT_S = 30  # bounds only, so that a broken test fails instead of hanging


@pytest.fixture
def held_prompts(catalogue, monkeypatch):
    """The model's chat template + tokenizer, instrumented: records the thread each prompt is encoded on, and
    holds work done off the event loop's thread until `release` is set."""
    [engine] = catalogue.engines.values()
    encode_chat = engine.prompts.encode_chat
    seen = {"threads": [], "entered": threading.Event(), "release": threading.Event()}

    def instrumented(*args, **kwargs):
        on_loop = threading.current_thread() is threading.main_thread()
        seen["threads"].append("loop" if on_loop else "thread")
        if not on_loop:
            seen["entered"].set()
            assert seen["release"].wait(WAIT_S), "the test never released the prompt work"
        return encode_chat(*args, **kwargs)

    monkeypatch.setattr(engine.prompts, "encode_chat", instrumented)
    return seen


def test_a_big_prompt_is_tokenised_on_a_thread_while_the_loop_answers_others(catalogue, held_prompts):
    async def go():
        async with running_app(catalogue) as app:
            small = {"model": app.model, "messages": [{"role": "user", "content": "Hi."}]}
            big = {"model": app.model, "messages": [{"role": "user", "content": "word " * 2000}]}  # 10 kB
            asking = asyncio.create_task(app.client.post("/v1/chat/completions", json=small))
            worker, request = await app.workers.next_submit()
            worker.finish(request.id)
            assert (await asking).status == 200
            asking = asyncio.create_task(app.client.post("/v1/chat/completions", json=big))
            assert await asyncio.to_thread(held_prompts["entered"].wait, WAIT_S)
            health = await app.client.get("/health")  # while the big prompt's work is held on its thread
            answered_while_held = health.status, not held_prompts["release"].is_set()
            held_prompts["release"].set()
            worker, request = await app.workers.next_submit()
            assert len(request.prompt_ids) > 2000
            worker.finish(request.id)
            return answered_while_held, (await asking).status

    (health, held), big_status = asyncio.run(go())
    assert held_prompts["threads"] == ["loop", "thread"]
    assert health == 200 and held and big_status == 200


def test_a_connection_that_never_finishes_its_request_head_is_closed(catalogue):
    async def go():
        async with running_app(catalogue, "--http.header-timeout-s", "0.2") as app:
            server = app.client.server
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            await writer.drain()
            closed = await asyncio.wait_for(reader.read(), WAIT_S)  # b"" once the server hangs up
            writer.close()
            return closed

    assert asyncio.run(go()) == b""


def test_a_streaming_client_that_stops_reading_is_cut_off_and_its_permit_given_back(catalogue, caplog):
    async def go():
        async with running_app(catalogue, "--http.stall-timeout-s", "0.2") as app:
            server = app.client.server
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (server.host, server.port))
            _, writer = await asyncio.open_connection(sock=sock)
            body = (b'{"model": "%s", "messages": [{"role": "user", "content": "Hi."}], "stream": true}'
                    % app.model.encode())
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            worker, request = await app.workers.next_submit()
            # The client reads nothing from here on; the engine keeps producing until the server gives up.
            chunk = "x" * 65536
            while request.id in worker.sinks:
                worker.emit(request.id, chunk, tokens=1)
                await asyncio.sleep(0.01)  # paces the engine's output; the test waits on events, not on time
            cancelled = await asyncio.wait_for(app.workers.cancels.get(), WAIT_S)
            await until(lambda: app.snapshot().running == 0, "the request to be let go")
            writer.close()
            return cancelled, request.id

    with caplog.at_level(logging.WARNING, logger="orchestrator.api.stall"):
        cancelled, request_id = asyncio.run(go())
    assert cancelled == request_id
    [warning] = [r.getMessage() for r in caplog.records if r.name == "orchestrator.api.stall"]
    assert "the client read nothing for 0.2 s" in warning and "bytes waiting; ending its stream" in warning
