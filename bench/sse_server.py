"""A bare aiohttp SSE server shaped like an OpenAI endpoint: the floor for the client plus aiohttp.

It generates nothing. A step clock ticks every `step_ms` (0: as fast as the loop turns) and gives every
stream in flight `burst` tokens per tick, all in the same tick, as an engine step does. Each stream's
handler wakes once per tick and writes that tick's chunks in one write, like Inferno's handler: one chunk
per token with OpenAI's chunk shape (pre-serialised per request), then the usage chunk and [DONE].
Requests must stream; `max_tokens` (or `max_completion_tokens`) is the number of tokens sent.
`python -m bench.baselines --baseline-sse` starts it and runs `inferno bench`'s workload against it.

    python -m bench.sse_server [--host 127.0.0.1] [--port 0] [--step-ms 0] [--burst 1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time

import orjson
from aiohttp import web

from orchestrator import aio

READY = "bare SSE server ready: "
_ids = itertools.count()


class Stream:
    __slots__ = ("left", "ready", "waiter")

    def __init__(self, tokens: int):
        self.left = tokens  # not yet handed out by the clock
        self.ready = 0  # handed out, not yet written
        self.waiter: asyncio.Future | None = None

    def give(self, tokens: int) -> None:
        self.left -= tokens
        self.ready += tokens
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class StepClock:
    """Every tick, each stream in flight gets `burst` tokens (fewer at its end)."""

    def __init__(self, step_s: float, burst: int):
        self.step_s, self.burst = step_s, burst
        self.streams: set[Stream] = set()
        self._wake = asyncio.Event()

    def add(self, stream: Stream) -> None:
        self.streams.add(stream)
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.streams:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            for stream in tuple(self.streams):
                stream.give(min(self.burst, stream.left))
                if not stream.left:
                    self.streams.discard(stream)
            deadline += self.step_s
            await asyncio.sleep(max(0.0, deadline - loop.time()))


class Chunks:
    """One request's SSE events, serialised once."""

    def __init__(self, body: dict, chat: bool, tokens: int):
        model = str(body.get("model", "bare-sse"))
        usage_on = bool((body.get("stream_options") or {}).get("include_usage"))
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
            envelope = {"id": f"chatcmpl-bare-{next(_ids)}", "object": "chat.completion.chunk",
                        "created": int(time.time()), "model": model, "system_fingerprint": None}
        else:
            prompt = str(body.get("prompt", ""))
            envelope = {"id": f"cmpl-bare-{next(_ids)}", "object": "text_completion", "created": int(time.time()),
                        "model": model}

        def event(choice: dict | None, usage=None) -> bytes:
            payload = {**envelope, "choices": [choice] if choice else []}
            if usage_on:
                payload["usage"] = usage
            return b"data: " + orjson.dumps(payload) + b"\n\n"

        def choice(text: str, finish: str | None, role: bool = False) -> dict:
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

        self.first = event(choice("", None, role=True)) if chat else b""
        self.token = event(choice(" tok", None))
        self.last = event(choice(" tok", "length"))
        prompt_tokens = len(prompt.split())  # words, as an approximation: nothing is tokenised here
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        self.end = (event(None, usage) if usage_on else b"") + b"data: [DONE]\n\n"


def _error(message: str, param: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return web.Response(status=400, body=orjson.dumps(body), content_type="application/json")


async def _generate(http: web.Request, clock: StepClock, chat: bool) -> web.StreamResponse:
    body = orjson.loads(await http.read())
    tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    if not body.get("stream"):
        return _error("the bare SSE server only streams: set stream to true", "stream")
    if not isinstance(tokens, int) or tokens < 1:
        return _error("max_tokens: give the number of tokens to stream (at least 1)", "max_tokens")
    chunks, stream, written = Chunks(body, chat, tokens), Stream(tokens), 0
    response: web.StreamResponse | None = None
    clock.add(stream)
    loop = asyncio.get_running_loop()
    while written < tokens:
        if not stream.ready:
            stream.waiter = loop.create_future()
            await stream.waiter
        count, stream.ready = stream.ready, 0
        written += count
        out = bytearray()
        if response is None:  # headers go out with the first output, as Inferno sends them
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(http)
            out += chunks.first
        out += chunks.token * (count - 1 if written == tokens else count)
        if written == tokens:
            out += chunks.last + chunks.end
        await response.write(out)
    await response.write_eof()
    return response


def make_app(step_ms: float, burst: int) -> web.Application:
    if step_ms < 0 or burst < 1:
        raise ValueError(f"step_ms must be >= 0 and burst >= 1 (got {step_ms}, {burst})")
    clock = StepClock(step_ms / 1000, burst)
    app = web.Application()

    async def run_clock(app: web.Application):
        task = asyncio.create_task(clock.run())
        yield
        task.cancel()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bare-sse", "object": "model", "owned_by": "inferno-bench"}]})

    async def completions(http: web.Request) -> web.StreamResponse:
        return await _generate(http, clock, chat=False)

    async def chat_completions(http: web.Request) -> web.StreamResponse:
        return await _generate(http, clock, chat=True)

    app.cleanup_ctx.append(run_clock)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


async def _serve(host: str, port: int, step_ms: float, burst: int) -> None:
    runner = web.AppRunner(make_app(step_ms, burst), handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    print(f"{READY}http://{bound[0]}:{bound[1]}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve_main(prog: str, description: str, serve, argv: list[str] | None) -> int:
    """A bare server's command line (this one's and raw_sse_server.py's): `serve(host, port, step_ms, burst)` until
    interrupted."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=0.0, help="time between ticks (0: as fast as possible)")
    parser.add_argument("--burst", type=int, default=1, help="tokens per stream per tick, one chunk each")
    args = parser.parse_args(argv)
    try:
        aio.run(serve(args.host, args.port, args.step_ms, args.burst))
    except (KeyboardInterrupt, web.GracefulExit):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve_main("python -m bench.sse_server", __doc__.splitlines()[0], _serve, argv)


if __name__ == "__main__":
    sys.exit(main())
