"""One path for every generation request: checked wire request -> scheduler lease -> worker -> SSE or JSON.

Chat and text completions differ only in their wire type and their `Format`.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from orchestrator.api.preparation import prepare_generation
from orchestrator.api.responses import Format, now
from orchestrator.api.stall import watch_stalls
from orchestrator.api.state import STATE
from orchestrator.api.wire import _GenerationRequest
from orchestrator.engine.request import TextDelta
from orchestrator.errors import InfernoError, error_body, kind_of
from orchestrator.lifecycle import InferenceRequest, RequestStatus

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def next_deltas(request: InferenceRequest) -> list[TextDelta]:
    """Everything that arrived for this request: one engine step's worth, usually."""
    deltas = [await request.events.get()]
    while not request.events.empty():
        deltas.append(request.events.get_nowait())
    return deltas


async def serve_generation(
    http: web.Request, wire: _GenerationRequest, fmt: Format, id_prefix: str
) -> web.StreamResponse:
    state = http.app[STATE]
    prepared = await prepare_generation(http, wire, id_prefix)  # the key's model and limits; the prompt
    engine, priority, request = prepared.slot.engine, prepared.priority, prepared.request
    fmt = Format(fmt.object_name, fmt.chunk_name, fmt.chat, f"fp_{engine.manifest.build.fingerprint.split(':')[-1][:12]}")
    http_status = 200
    try:
        async with state.scheduler.lease(request, priority) as worker:
            for choice in request.choices:
                worker.submit(choice.engine_request, request.deliver)
            if request.stream:
                return await _stream(http, request, fmt, wire.include_usage, wire.continuous_usage)
            return await _collect(request, fmt)
    except InfernoError as exc:
        http_status = kind_of(exc).status
        request.finish(RequestStatus.FINISHED_ERROR)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        http_status = 499  # the client went away; the lease cancelled its engine requests
        request.finish(RequestStatus.FINISHED_CANCELLED)
        raise
    finally:
        state.request_metrics.observe(request, http_status)


async def _collect(request: InferenceRequest, fmt: Format) -> web.Response:
    created = now()
    texts: list[list[str]] = [[request.echo or ""] for _ in request.choices]
    while not request.all_finished:
        for delta in await next_deltas(request):
            choice = request.record(delta)
            if choice.error is not None:
                raise choice.error
            texts[choice.index].append(delta.text)
    request.finish(request.final_status())
    body = fmt.response(request, ["".join(parts) for parts in texts], created)
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _stream(
    http: web.Request, request: InferenceRequest, fmt: Format, include_usage: bool, continuous_usage: bool
) -> web.StreamResponse:
    """SSE as OpenAI sends it. Headers go out with the first output, so an error before any token is still
    a plain JSON error with its status; after that, an error is an SSE error event."""
    created = now()
    response: web.StreamResponse | None = None
    offsets = [0] * len(request.choices)  # characters streamed per choice, for text completions' logprobs
    while True:
        deltas = await next_deltas(request)
        out = bytearray()
        if response is None:
            first_error = next((d for d in deltas if d.error is not None), None)
            if first_error is not None:
                raise request.record(first_error).error
            response = await _open_stream(http)
            stalls = watch_stalls(http)
            for choice in request.choices:
                out += sse(fmt.chunk(request, created, choice.index, request.echo, role=True,
                                     include_usage=include_usage, continuous_usage=continuous_usage))
        for delta in deltas:
            choice = request.record(delta)
            if choice.error is not None:
                request.finish(RequestStatus.FINISHED_ERROR)
                out += sse(error_body(choice.error)) + DONE
                stalls.wrote(len(out))
                await response.write(out)
                return response
            if delta.text or delta.finish is not None or delta.logprobs:
                chunk = fmt.chunk(
                    request, created, choice.index, delta.text, delta.finish, include_usage=include_usage,
                    continuous_usage=continuous_usage, logprobs=delta.logprobs, offset=offsets[choice.index],
                    alternatives=choice.engine_request.top_logprobs,
                )
                offsets[choice.index] += len(delta.text)
                out += sse(chunk)
        if request.all_finished:
            request.finish(request.final_status())
            if include_usage:
                out += sse(fmt.usage_chunk(request, created))
            out += DONE
            stalls.wrote(len(out))
            await response.write(out)
            await response.write_eof()
            return response
        stalls.wrote(len(out))
        await response.write(out)


async def _open_stream(http: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(http)
    return response
