"""One path for every generation request: checked wire request -> scheduler lease -> worker -> SSE or JSON.

Chat and text completions differ only in their wire type and their `Format`.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from orchestrator.api.preparation import prepare_generation
from orchestrator.api.record import record_of
from orchestrator.api.responses import Format, now
from orchestrator.api.sse import DONE, ChunkTemplates, SseWriter, sse
from orchestrator.api.stall import watch_stalls
from orchestrator.api.state import STATE
from orchestrator.api.wire import _GenerationRequest
from orchestrator.errors import InfernoError, error_body, kind_of
from orchestrator.ipc.messages import TextDelta
from orchestrator.lifecycle import Choice, InferenceRequest, RequestStatus


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
    engine, priority, request = prepared.model.engine, prepared.priority, prepared.request
    fmt = Format(fmt.object_name, fmt.chunk_name, fmt.chat, f"fp_{engine.manifest.build.fingerprint.split(':')[-1][:12]}")
    http_status = 200
    try:
        if request.guide is not None:  # a grammar that does not compile never reaches an engine
            eos = engine.manifest.tokenizer.eos_token_ids
            await state.grammar.check(engine.folder, request.guide, stop_token_ids=eos)
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


def _take_text(choice: Choice, text: str) -> bool:
    """A whole response's fast path: keep the text for the end; nothing to wake for."""
    choice.parts.append(text)
    return True


async def _collect(request: InferenceRequest, fmt: Format) -> web.Response:
    created = now()
    for choice in request.choices:
        choice.parts.append(request.echo or "")
    request.fast_path = _take_text
    while not request.all_finished:
        for delta in await next_deltas(request):
            choice = request.record(delta)
            if choice.error is not None:
                raise choice.error
    request.finish(request.final_status())
    body = fmt.response(request, ["".join(choice.parts) for choice in request.choices], created)
    return web.Response(body=orjson.dumps(body), content_type="application/json")


class _EventStream:
    """One response's event stream: OpenAI's chunks, in order, over an SseWriter. Plain text rows are written by
    `fast_text` straight from the worker reader's dispatch; everything else passes through `handle`."""

    def __init__(self, http: web.Request, request: InferenceRequest, fmt: Format, include_usage: bool,
                 continuous_usage: bool):
        self.http, self.request, self.fmt = http, request, fmt
        self.include_usage, self.continuous_usage = include_usage, continuous_usage
        self.created = now()
        self.writer: SseWriter | None = None
        self.offsets = [0] * len(request.choices)  # characters streamed per choice, for text completions' logprobs
        self.templates = ChunkTemplates(
            lambda index, text: fmt.chunk(request, self.created, index, text, include_usage=include_usage)
        )

    async def open(self) -> None:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        response.enable_chunked_encoding()
        await response.prepare(self.http)
        self.writer = SseWriter(response, self.http, watch_stalls(self.http).wrote)
        first = b"".join(
            sse(self.fmt.chunk(self.request, self.created, choice.index, self.request.echo, role=True,
                               include_usage=self.include_usage, continuous_usage=self.continuous_usage))
            for choice in self.request.choices
        )
        await self.writer.send(first)
        if not self.continuous_usage:  # usage on every chunk is rendered in full each time
            self.request.fast_path = self.fast_text

    def fast_text(self, choice: Choice, text: str) -> bool:
        return not text or self.writer.write(self.templates.text(choice.index, text))

    def chunk(self, choice: Choice, delta: TextDelta) -> bytes:
        chunk = self.fmt.chunk(
            self.request, self.created, choice.index, delta.text, delta.finish, include_usage=self.include_usage,
            continuous_usage=self.continuous_usage, logprobs=delta.logprobs, offset=self.offsets[choice.index],
            alternatives=choice.engine_request.top_logprobs, reasoning=delta.reasoning, tool_calls=delta.tool_calls,
        )
        self.offsets[choice.index] += len(delta.text)
        return sse(chunk)

    async def handle(self, deltas: list[TextDelta]) -> bool:
        """Write what these deltas say; True once the stream has ended."""
        request, out = self.request, bytearray()
        for delta in deltas:
            choice = request.record(delta)
            if choice.error is not None:
                request.finish(RequestStatus.FINISHED_ERROR)
                error = error_body(choice.error, record_of(self.http).id)  # the id the logs know it by
                await self.writer.send(bytes(out) + sse(error) + DONE)
                await self.writer.close()
                return True
            if delta.text or delta.finish is not None or delta.logprobs or delta.reasoning or delta.tool_calls:
                out += self.chunk(choice, delta)
        if request.all_finished:
            request.finish(request.final_status())
            if self.include_usage:
                out += sse(self.fmt.usage_chunk(request, self.created))
            await self.writer.send(bytes(out) + DONE)
            await self.writer.close()
            return True
        await self.writer.send(bytes(out))
        return False


async def _stream(
    http: web.Request, request: InferenceRequest, fmt: Format, include_usage: bool, continuous_usage: bool
) -> web.StreamResponse:
    """SSE as OpenAI sends it. Headers go out with the first output, so an error before any token is still
    a plain JSON error with its status; after that, an error is an SSE error event."""
    stream = _EventStream(http, request, fmt, include_usage, continuous_usage)
    while True:
        deltas = await next_deltas(request)
        if stream.writer is None:
            first_error = next((d for d in deltas if d.error is not None), None)
            if first_error is not None:
                raise request.record(first_error).error
            await stream.open()
        if await stream.handle(deltas):
            return stream.writer.response
