"""A small logging HTTP server that shows what a client really sends.

Every request is written to a folder as one JSON file (method, path, query, headers with secrets
redacted, the JSON body or the raw text) and answered with the smallest valid reply, so a client goes on
to its next request: `/v1/responses` gets a streamed (or whole) Responses API answer, `/v1/messages` a
streamed (or whole) Anthropic message, `/v1/messages/count_tokens` a count, `/v1/models` one model, and
anything else an empty JSON object. With `--fail N`, the N-th generation request (1-based) is answered
with a 400 in that API's own error shape instead: how a client shows a prompt over the context.

Point Codex CLI or Claude Code at it (see README, "Coding agents") and read the folder:

    python -m tests.agents.logging_server --port 8765 --dir /tmp/captures [--model NAME] [--fail N]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from pathlib import Path

from aiohttp import web

READY = "logging server ready: "
SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "proxy-authorization"}
ANSWER = "Hello from the logging server."
TOO_LONG = "prompt is too long: 40000 tokens > 32768 maximum"


def _redacted(headers) -> dict[str, str]:
    return {k: ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}


class Recorder:
    """Writes each request to `<dir>/<seq>-<method>-<path>.json` and counts generation requests."""

    def __init__(self, folder: Path, fail: int | None):
        self.folder = folder
        self.fail = fail
        self.seq = itertools.count(1)
        self.generations = 0
        folder.mkdir(parents=True, exist_ok=True)

    async def record(self, request: web.Request) -> dict:
        raw = await request.text()
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = {"_raw": raw}
        entry = {
            "time": time.time(),
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "headers": _redacted(request.headers),
            "body": body,
        }
        slug = request.path.strip("/").replace("/", "_") or "root"
        name = f"{next(self.seq):03d}-{request.method}-{slug}.json"
        (self.folder / name).write_text(json.dumps(entry, indent=2, ensure_ascii=False))
        print(f"{request.method} {request.path_qs} -> {name}", flush=True)
        return entry

    def should_fail(self) -> bool:
        self.generations += 1
        return self.fail is not None and self.generations == self.fail


def _sse(events: list[tuple[str, dict]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


async def _stream(request: web.Request, events: list[tuple[str, dict]]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(_sse(events))
    await response.write_eof()
    return response


def responses_answer(model: str) -> tuple[dict, list[tuple[str, dict]]]:
    """A whole Responses API object and the event stream that ends in it."""
    message = {
        "id": "msg_log_1", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
    }
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 7,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 17}
    base = {"id": "resp_log_1", "object": "response", "created_at": int(time.time()), "model": model}
    done = {**base, "status": "completed", "output": [message], "usage": usage}
    opening = {**base, "status": "in_progress", "output": []}
    empty = {**message, "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    at = {"item_id": "msg_log_1", "output_index": 0, "content_index": 0}
    events = [
        ("response.created", {"type": "response.created", "sequence_number": 0, "response": opening}),
        ("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": opening}),
        ("response.output_item.added",
         {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": empty}),
        ("response.content_part.added",
         {"type": "response.content_part.added", "sequence_number": 3, **at, "part": part}),
        ("response.output_text.delta",
         {"type": "response.output_text.delta", "sequence_number": 4, **at, "delta": ANSWER}),
        ("response.output_text.done",
         {"type": "response.output_text.done", "sequence_number": 5, **at, "text": ANSWER}),
        ("response.content_part.done",
         {"type": "response.content_part.done", "sequence_number": 6, **at, "part": message["content"][0]}),
        ("response.output_item.done",
         {"type": "response.output_item.done", "sequence_number": 7, "output_index": 0, "item": message}),
        ("response.completed", {"type": "response.completed", "sequence_number": 8, "response": done}),
    ]
    return done, events


def messages_answer(model: str) -> tuple[dict, list[tuple[str, dict]]]:
    """A whole Anthropic message and the event stream that builds it."""
    usage = {"input_tokens": 10, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    whole = {"id": "msg_log_1", "type": "message", "role": "assistant", "model": model,
             "content": [{"type": "text", "text": ANSWER}], "stop_reason": "end_turn",
             "stop_sequence": None, "usage": usage}
    opening = {**whole, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events = [
        ("message_start", {"type": "message_start", "message": opening}),
        ("content_block_start",
         {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
        ("content_block_delta",
         {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 7}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return whole, events


def build_app(recorder: Recorder, model: str) -> web.Application:
    async def responses(request: web.Request) -> web.StreamResponse:
        entry = await recorder.record(request)
        if recorder.should_fail():
            error = {"message": f"This model's maximum context length is 32768 tokens. ({TOO_LONG})",
                     "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}
            return web.json_response({"error": error}, status=400)
        whole, events = responses_answer((entry["body"] or {}).get("model", model))
        return await _stream(request, events) if (entry["body"] or {}).get("stream") else web.json_response(whole)

    async def messages(request: web.Request) -> web.StreamResponse:
        entry = await recorder.record(request)
        if recorder.should_fail():
            error = {"type": "invalid_request_error", "message": TOO_LONG}
            return web.json_response({"type": "error", "error": error}, status=400)
        whole, events = messages_answer((entry["body"] or {}).get("model", model))
        return await _stream(request, events) if (entry["body"] or {}).get("stream") else web.json_response(whole)

    async def count_tokens(request: web.Request) -> web.Response:
        await recorder.record(request)
        return web.json_response({"input_tokens": 10})

    async def models(request: web.Request) -> web.Response:
        await recorder.record(request)
        card = {"id": model, "object": "model", "created": 0, "owned_by": "inferno",
                "type": "model", "display_name": model, "created_at": "2024-01-01T00:00:00Z"}
        return web.json_response({"object": "list", "data": [card], "has_more": False,
                                  "first_id": model, "last_id": model})

    async def anything(request: web.Request) -> web.Response:
        await recorder.record(request)
        return web.json_response({})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


async def serve(host: str, port: int, recorder: Recorder, model: str) -> None:
    runner = web.AppRunner(build_app(recorder, model), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # the port chosen when --port is 0
    print(f"{READY}http://{host}:{bound}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", type=Path, required=True, help="folder the requests are written to")
    parser.add_argument("--model", default="smollm2-135m", help="the one model /v1/models lists")
    parser.add_argument("--fail", type=int, default=None, help="answer the N-th generation request with a 400")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, Recorder(args.dir, args.fail), args.model))


if __name__ == "__main__":
    main()
