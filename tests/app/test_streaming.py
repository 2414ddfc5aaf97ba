"""Streams from the real app, in-process: SSE as OpenAI sends it, errors before and after the first token,
and `n > 1` choices interleaved. The engine's output is scripted step by step through in-loop workers."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections import Counter

import openai

from orchestrator.engine.request import FinishReason
from orchestrator.errors import EngineError, WorkerCrashed
from orchestrator.ipc.messages import TextDelta
from tests.app.harness import running_app, sse_events

HI = [{"role": "user", "content": "Say hello."}]


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": HI, "stream": True, **extra}


def test_a_stream_is_framed_as_openai_sends_it(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            body = chat(app.model, stream_options={"include_usage": True})
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Hello", tokens=1)
            response = await responding  # headers go out with the first output
            worker.emit(request.id, ", world", tokens=2)
            worker.emit(request.id, "!", tokens=1, finish=FinishReason.STOP)
            return response.status, dict(response.headers), await response.read()

    status, headers, raw = asyncio.run(go())
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream" and headers["Cache-Control"] == "no-cache"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    deltas = [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in chunks[:-1]]
    assert deltas == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
        ({"content": ", world"}, None),
        ({"content": "!"}, "stop"),
    ]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_the_official_client_reads_the_stream(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            base_url = str(app.client.make_url("/v1"))
            client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)

            async def read_stream():
                stream = await client.chat.completions.create(
                    model=app.model, messages=HI, stream=True, stream_options={"include_usage": True}
                )
                return [chunk async for chunk in stream]

            reading = asyncio.create_task(read_stream())
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Hello", tokens=1)
            worker.emit(request.id, " there", tokens=1, finish=FinishReason.LENGTH)
            chunks = await reading
            await client.close()
            return chunks

    chunks = asyncio.run(go())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 2


def test_an_error_before_the_first_token_is_a_plain_json_error_with_its_status(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=chat(app.model)))
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, error=EngineError("the engine ran out of KV cache blocks"))
            response = await responding
            return response.status, response.headers, await response.json()

    status, headers, body = asyncio.run(go())
    assert status == 500 and headers["Content-Type"] == "application/json"
    assert body == {"error": {"message": "the engine ran out of KV cache blocks", "type": "server_error",
                              "param": None, "code": "engine_error", "request_id": headers["X-Request-Id"]}}


def test_an_error_after_the_first_token_is_an_sse_error_event_and_the_stream_ends(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=chat(app.model)))
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Once upon", tokens=2)
            response = await responding
            worker.crash()
            return response.status, await response.read()

    status, raw = asyncio.run(go())
    assert status == 200
    *chunks, error, done = sse_events(raw)
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "Once upon"]
    assert error["error"]["code"] == "worker_crashed" and "SIGKILL" in error["error"]["message"]
    assert done == "[DONE]"


def test_n_choices_stream_interleaved_in_the_order_the_engine_produced_them(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=chat(app.model, n=2)))
            worker, first = await app.workers.next_submit()
            _, second = await app.workers.next_submit()
            worker.emit(first.id, "A", tokens=1)
            worker.emit(second.id, "B", tokens=1)
            worker.emit(first.id, "C", tokens=1)
            worker.emit(second.id, "D", tokens=1, finish=FinishReason.STOP)
            worker.emit(first.id, "E", tokens=1, finish=FinishReason.LENGTH)
            response = await responding
            return [first.id, second.id], await response.read()

    ids, raw = asyncio.run(go())
    assert ids[0].endswith(".0") and ids[1].endswith(".1")
    *chunks, done = sse_events(raw)
    seen = [(c["choices"][0]["index"], c["choices"][0]["delta"].get("content"), c["choices"][0]["finish_reason"])
            for c in chunks]
    assert seen == [
        (0, "", None), (1, "", None),
        (0, "A", None), (1, "B", None), (0, "C", None), (1, "D", "stop"), (0, "E", "length"),
    ]
    assert done == "[DONE]"


def test_n_choices_in_one_whole_response(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            body = {"model": app.model, "messages": HI, "n": 2}
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, first = await app.workers.next_submit()
            _, second = await app.workers.next_submit()
            worker.emit(second.id, "second", tokens=1, finish=FinishReason.STOP)
            worker.emit(first.id, "first", tokens=1, finish=FinishReason.STOP)
            response = await responding
            return await response.json()

    body = asyncio.run(go())
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "first"), (1, "second")]
    assert body["usage"]["completion_tokens"] == 2


def test_a_worker_gone_before_the_request_is_a_503(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=chat(app.model)))
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, error=WorkerCrashed("the worker for model 'x' is gone"))
            response = await responding
            return response.status, (await response.json())["error"]["code"]

    assert asyncio.run(go()) == (503, "worker_crashed")


def test_a_stream_its_worker_writes_and_hands_back_mid_chunk_reaches_the_client_whole(catalogue):
    """The app's half of an attached stream (ipc/messages.py's Submit, worker/direct.py): the connection's socket goes
    with the submit, with the response's head. What the worker writes to the socket itself (the head with its
    first text, then chunks) and the rest of a chunk it hands back (a row's tail) reach the client in order before
    what the app writes next, with every token counted and the first token's time taken from the worker."""
    async def go():
        async with running_app(catalogue) as app:
            app.workers.take_sockets = True
            body = chat(app.model, stream_options={"include_usage": True})
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, request = await app.workers.next_submit()
            fd, head, prefix, suffix = worker.sockets[request.id]

            def framed(text: str) -> bytes:
                data = prefix + json.dumps(text).encode() + suffix
                return b"%x\r\n%b\r\n" % (len(data), data)

            first_token = time.monotonic()
            os.write(fd, head + framed("Hello") + framed(", wor"))
            response = await responding  # the head came from the worker
            third = framed("ld")
            os.write(fd, third[:7])
            os.close(fd)
            worker.sinks[request.id](
                TextDelta(request.id, "", 3, tail=third[7:].decode("latin-1"), first_token=first_token).to_wire())
            worker.emit(request.id, "!", tokens=1)
            worker.emit(request.id, "", tokens=0, finish=FinishReason.STOP)
            return response, await response.read()

    response, raw = asyncio.run(go())
    assert response.status == 200 and response.headers["Content-Type"] == "text/event-stream"
    assert response.headers["X-Request-Id"].startswith("req_")  # the app's own headers, in the head it handed over
    chunks = sse_events(raw)[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]] == [
        "Hello", ", wor", "ld", "!", None]
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_a_worker_that_holds_the_socket_and_writes_nothing_leaves_every_answer_to_the_app(catalogue):
    """The worker took the socket but wrote nothing (it sends rows without a tail): an error before the first token
    is still a plain JSON error with its status, and a first row that is the finish is written by the app, head
    and all."""
    async def go():
        async with running_app(catalogue) as app:
            app.workers.take_sockets = True
            out = []
            for emit in ({"error": EngineError("the engine ran out of KV cache blocks")},
                         {"text": "Hi", "tokens": 1, "finish": FinishReason.LENGTH}):
                responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=chat(app.model)))
                worker, request = await app.workers.next_submit()
                os.close(worker.sockets.pop(request.id)[0])
                worker.emit(request.id, **emit)
                response = await responding
                out.append((response.status, await response.read()))
            return out

    (error_status, error), (status, raw) = asyncio.run(go())
    assert error_status == 500 and json.loads(error)["error"]["code"] == "engine_error"
    chunks = sse_events(raw)[:-1]
    assert status == 200 and chunks[1]["choices"][0] == {"index": 0, "delta": {"content": "Hi"}, "logprobs": None,
                                                         "finish_reason": "length"}


def test_an_attached_stream_watches_for_stalls_unless_its_end_comes_back_alone(catalogue, monkeypatch):
    """Its worker wrote everything before the end: an end that comes back alone (one row, a few hundred bytes into a
    transport holding nothing) never waits for the client, so no stall watch starts. Rows that come with the end (a
    chunk's tail handed back, more text) could pass the write buffer's high water, and aiohttp's `write_eof` would
    then wait on the client: that stream is watched, as is one whose worker did not take the socket (its one row
    may hold any amount of text)."""
    from orchestrator.api import generation

    watched: list[str] = []

    def watch_stalls(http, handed):
        watched.append(http.path)
        return real(http, handed)

    real = generation.watch_stalls
    monkeypatch.setattr(generation, "watch_stalls", watch_stalls)

    async def go(end_alone: bool, attach: bool = True):
        async with running_app(catalogue) as app:
            app.workers.take_sockets = attach
            responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=chat(app.model)))
            worker, request = await app.workers.next_submit()
            if not attach:  # the app writes every row: here one, the whole answer and its end
                worker.emit(request.id, "Hello", tokens=1, finish=FinishReason.STOP)
            else:
                fd, head, prefix, suffix = worker.sockets.pop(request.id)
                data = prefix + b'"Hello"' + suffix
                os.write(fd, head + b"%x\r\n%b\r\n" % (len(data), data))
                os.close(fd)
                sink, first_token = worker.sinks[request.id], time.monotonic()
                if end_alone:  # the worker wrote every token: its end says so with an empty tail
                    del worker.sinks[request.id]
                    sink(TextDelta(request.id, "", 1, FinishReason.STOP, tail="", first_token=first_token).to_wire())
                else:  # handed back mid-stream, then more text and the end, all before the handler wakes
                    sink(TextDelta(request.id, "", 1, tail="", first_token=first_token).to_wire())
                    worker.emit(request.id, " world", tokens=1)
                    worker.emit(request.id, "", tokens=0, finish=FinishReason.STOP)
            response = await responding
            return [c["choices"][0]["delta"].get("content") for c in sse_events(await response.read())[1:-1]]

    assert asyncio.run(go(end_alone=True)) == ["Hello", None] and watched == []
    assert asyncio.run(go(end_alone=False)) == ["Hello", " world", None]
    assert watched == ["/v1/chat/completions"]
    assert asyncio.run(go(end_alone=True, attach=False)) == ["Hello"]
    assert watched == ["/v1/chat/completions"] * 2


def test_a_worker_gone_while_it_held_the_socket_is_answered_after_what_it_wrote(catalogue):
    """Its process went away after the submit that gave it the socket, so no row says what it wrote: the kernel's
    count of the bytes sent on the connection does. Having written (its head and a chunk), the stream ends with an
    error event naming the crash; having written nothing, the answer is a plain JSON 503."""
    async def go(writes: bool):
        async with running_app(catalogue) as app:
            app.workers.take_sockets = True
            body = json.dumps(chat(app.model)).encode()
            reader, writer = await asyncio.open_connection(app.client.host, app.client.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
            worker, request = await app.workers.next_submit()
            fd, head, prefix, suffix = worker.sockets.pop(request.id)
            if writes:
                data = prefix + b'"Once"' + suffix
                os.write(fd, head + b"%x\r\n%b\r\n" % (len(data), data))
            os.close(fd)
            worker.crash()
            raw = await asyncio.wait_for(reader.read(), 10)  # to the connection's end
            writer.close()
            return raw

    raw = asyncio.run(go(writes=True))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"HTTP/1.1" not in body
    data = b""
    while body:  # the chunks, every one whole, to the last
        size, _, body = body.partition(b"\r\n")
        data, body = data + body[: int(size, 16)], body[int(size, 16) + 2 :]
    events = sse_events(data)
    assert events[1]["choices"][0]["delta"]["content"] == "Once" and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "worker_crashed"
    raw = asyncio.run(go(writes=False))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and json.loads(body)["error"]["code"] == "worker_crashed"


def test_only_a_one_choice_stream_of_plain_text_hands_its_socket_to_the_worker(catalogue):
    """n > 1, log probabilities, usage on every chunk and whole responses are written by the app: no socket goes
    with their submits, and nothing is answered."""
    async def go():
        async with running_app(catalogue) as app:
            app.workers.take_sockets = True
            bodies = [chat(app.model, n=2), chat(app.model, logprobs=True),
                      chat(app.model, stream_options={"include_usage": True, "continuous_usage_stats": True}),
                      chat(app.model, stream=False), chat(app.model)]
            handed = []
            for body in bodies:
                responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
                for _ in range(body.get("n", 1)):
                    worker, request = await app.workers.next_submit()
                    worker.emit(request.id, "Hi", tokens=1, finish=FinishReason.STOP)
                    handed.append(request.id in worker.sockets)
                assert (await responding).status == 200
            os.close(worker.sockets.pop(request.id)[0])
            return handed

    assert asyncio.run(go()) == [False, False, False, False, False, True]


def test_an_http_1_0_client_gets_the_stream_unchunked_to_the_connections_end(catalogue):
    """HTTP/1.0 has no chunked encoding (nginx's `proxy_pass` speaks it by default): the events go as they are, the
    connection's end ends the body, and the app writes every one (the worker writes chunks; no socket goes to it)."""
    async def go():
        async with running_app(catalogue) as app:
            app.workers.take_sockets = True
            body = json.dumps(chat(app.model, stream_options={"include_usage": True})).encode()
            reader, writer = await asyncio.open_connection(app.client.host, app.client.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            worker, request = await app.workers.next_submit()
            for text in ("Hello", " there"):
                worker.emit(request.id, text, tokens=1)
            worker.emit(request.id, "!", tokens=1, finish=FinishReason.STOP)
            raw = await asyncio.wait_for(reader.read(), 10)  # to the connection's end
            writer.close()
            return raw, worker.sockets

    raw, handed = asyncio.run(go())
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower() and handed == {}
    events = [line[6:] for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello there!"
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_a_finished_request_leaves_nothing_for_the_cyclic_collector(catalogue):
    """A request's objects (its stream, its lifecycle, aiohttp's request) are freed by reference counting as it
    ends. A cycle among them would leave every request's graph to the cyclic collector, whose passes then stop the
    event loop for tens of milliseconds at a time under a full load."""
    async def one(app, body: dict) -> bytes:
        responding = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
        worker, request = await app.workers.next_submit()
        worker.emit(request.id, "Hello", tokens=1)
        worker.emit(request.id, "!", tokens=1, finish=FinishReason.STOP)
        return await (await responding).read()

    async def go():
        async with running_app(catalogue) as app:
            answers = [await one(app, chat(app.model)),
                       await one(app, chat(app.model, stream_options={"include_usage": True})),
                       await one(app, {**chat(app.model), "stream": False})]
        return answers

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage, to be looked at
    try:
        answers = asyncio.run(go())  # the app has stopped: every handler has returned
        gc.collect()
        left = Counter(type(thing).__name__ for thing in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert b"[DONE]" in answers[0] and b"[DONE]" in answers[1] and b"Hello!" in answers[2]
    per_request = {"InferenceRequest", "Choice", "EngineRequest", "_EventStream", "SseWriter", "RequestRecord"}
    assert not per_request & set(left), f"left in cycles: {dict(left)}"
