"""One path for every generation request: checked wire request -> scheduler lease -> worker -> SSE or JSON.

Every front door goes through it. Chat and text completions differ only in their wire type and their `Format`
(completions_format.py), and are written with a fast path for plain text. The agent APIs (OpenAI's Responses,
Anthropic's Messages) are front doors of their own wire type and an `EventPresenter`: the same preparation, lease
and engine output, written as their named server-sent events or as one JSON body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import orjson
from aiohttp import HttpVersion11, web

from orchestrator.access.keys import ANONYMOUS
from orchestrator.api.completions_format import Format, now
from orchestrator.api.preparation import FrontDoorRequest, Prepared, prepare_generation
from orchestrator.api.record import record_of
from orchestrator.api.sse import (
    DONE,
    ChunkTemplates,
    SseWriter,
    bytes_sent,
    idle_fd,
    open_event_stream,
    prepare_event_stream,
    sse,
    unprepare_event_stream,
)
from orchestrator.api.stall import watch_stalls
from orchestrator.api.state import STATE
from orchestrator.api.wire import _GenerationRequest
from orchestrator.errors import InfernoError, WorkerCrashed, error_body, kind_of
from orchestrator.ipc.messages import TextDelta
from orchestrator.lifecycle import Choice, InferenceRequest, RequestStatus

Event = tuple[str, dict]  # a named server-sent event: its name and its data
# A stream's client socket, its head and its chunk's bytes around the text, for its worker to write it.
Offer = Callable[[], Awaitable[tuple[int, bytes, bytes, bytes] | None]]
KEEPALIVE_S = 10.0  # an agent API's stream with no output this long gets a keepalive


async def next_deltas(request: InferenceRequest) -> list[TextDelta]:
    """Everything that arrived for this request: one engine step's worth, usually."""
    deltas = [await request.events.get()]
    while not request.events.empty():
        deltas.append(request.events.get_nowait())
    return deltas


@asynccontextmanager
async def running(http: web.Request, prepared: Prepared, offer: Offer | None = None) -> AsyncIterator[InferenceRequest]:
    """The prepared request, its grammar checked, admitted by the scheduler and submitted to a worker, for the
    body of the `async with` to read its output; the lease ends (and cancels what is still running) with it.
    `offer`: a stream's client socket, head and chunk bytes, asked for at the submit, for the worker to write its
    text (`_EventStream.offer`). The request's metrics are observed once, whatever happened."""
    state, engine, request = http.app[STATE], prepared.model.engine, prepared.request
    http_status = 200
    try:
        if request.guide is not None:  # a grammar that does not compile never reaches an engine
            eos = engine.manifest.tokenizer.eos_token_ids
            await state.grammar.check(  # the tenant's checks in flight are capped
                engine.folder, request.guide, stop_token_ids=eos, rows=len(request.choices),
                key=None if prepared.tenant.key == ANONYMOUS.name else prepared.tenant.key,
            )
        async with state.scheduler.lease(request, prepared.priority, prepared.tenant) as worker:
            request.worker = worker
            attach = await offer() if offer is not None else None
            for choice in request.choices:
                request.attached = worker.submit(choice.engine_request, request.deliver, attach)
            yield request
    except InfernoError as exc:
        http_status = kind_of(exc).status
        request.finish(RequestStatus.FINISHED_ERROR)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        http_status = 499  # the client went away; the lease cancelled its engine requests
        request.finish(RequestStatus.FINISHED_CANCELLED)
        raise
    finally:
        request.fast_path = None  # a stream's own method: the request's graph is freed as soon as it ends
        state.request_metrics.observe(request, http_status)


async def serve_generation(
    http: web.Request, wire: _GenerationRequest, fmt: Format, id_prefix: str
) -> web.StreamResponse:
    """Chat and text completions."""
    prepared = await prepare_generation(http, wire, id_prefix)  # the key's model and limits; the prompt
    engine = prepared.model.engine
    fmt = Format(fmt.object_name, fmt.chunk_name, fmt.chat, f"fp_{engine.manifest.build.fingerprint.split(':')[-1][:12]}")
    stream = _EventStream(http, prepared.request, fmt, wire.include_usage, wire.continuous_usage) \
        if prepared.request.stream else None
    try:
        async with running(http, prepared, stream and stream.offer) as request:
            if stream is not None:
                return await _stream(stream)
            await collect(request)
            body = fmt.response(request, ["".join(choice.parts) for choice in request.choices], now())
            return web.Response(body=orjson.dumps(body), content_type="application/json")
    except Exception as exc:
        if stream is not None:
            stream.failed(exc)
        raise


class EventPresenter(Protocol):
    """How an agent API writes one request's output: its whole body, or its stream of named events. Made per
    request (it keeps the stream's state: open blocks, sequence numbers)."""

    def response(self, request: InferenceRequest) -> dict:
        """The whole body, once every choice has finished (their text, reasoning and tool calls collected)."""

    def opening(self, request: InferenceRequest) -> list[Event]:
        """The events before any output."""

    def delta(self, request: InferenceRequest, choice: Choice, delta: TextDelta) -> list[Event]:
        """The events for one delta of output (text, reasoning, tool-call entries, a finish)."""

    def closing(self, request: InferenceRequest) -> list[Event]:
        """The events once every choice has finished."""

    def failure(self, request: InferenceRequest, error: InfernoError, request_id: str) -> list[Event]:
        """The events that end a stream that failed after it began."""

    def keepalive(self) -> list[Event]:
        """The events that tell the client the request runs on while there is no output ([]: an SSE comment)."""


def event_bytes(events: list[Event]) -> bytes:
    return b"".join(b"event: %b\ndata: %b\n\n" % (name.encode(), orjson.dumps(data)) for name, data in events)


async def serve_events(http: web.Request, wire: FrontDoorRequest,
                       presenter_for: Callable[[Prepared], EventPresenter], id_prefix: str,
                       prepared: Prepared | None = None) -> web.StreamResponse:
    """An agent API's generation: the same preparation and lease as chat, written by its presenter."""
    prepared = prepared or await prepare_generation(http, wire, id_prefix)
    presenter = presenter_for(prepared)
    async with running(http, prepared) as request:
        if not request.stream:
            await collect(request)
            return web.Response(body=orjson.dumps(presenter.response(request)), content_type="application/json")
        return await _stream_events(http, request, presenter)


async def collect(request: InferenceRequest) -> None:
    """Wait for every choice to finish, their output collected on them; raises a choice's error."""
    for choice in request.choices:
        choice.parts.append(request.echo or "")
    request.fast_path = _take_text
    while not request.all_finished:
        for delta in await next_deltas(request):
            choice = request.record(delta)
            if choice.error is not None:
                raise choice.error
    request.finish(request.final_status())


async def _open_event_stream(http: web.Request, first: bytes) -> SseWriter:
    """The stream's headers and `first`, its first events, in one write; its stall watch started."""
    writer = await open_event_stream(http, first)
    watch_stalls(http, writer.handed_bytes)
    return writer


async def _stream_events(http: web.Request, request: InferenceRequest, presenter: EventPresenter
                         ) -> web.StreamResponse:
    """Named events. As for chat, the headers go out with the first output, so an error before it is a plain
    JSON error with its status; after that, the presenter's failure events end the stream. A prompt whose prefill
    takes longer than KEEPALIVE_S (a long agent prompt on a slow device) opens the stream before its first output,
    and every KEEPALIVE_S without output the presenter's keepalive is sent (Anthropic's `ping`; otherwise an SSE
    comment), so that clients with an idle timeout on the stream do not give up on a request that is running."""
    writer: SseWriter | None = None
    request.keeps_output = True  # the closing events carry the whole response
    while True:
        try:
            async with asyncio.timeout(KEEPALIVE_S):  # a timer per step, not a task as wait_for makes
                deltas = await next_deltas(request)
        except TimeoutError:
            keepalive = event_bytes(presenter.keepalive()) or b": keepalive\n\n"
            if writer is None:
                writer = await _open_event_stream(http, event_bytes(presenter.opening(request)) + keepalive)
            else:
                await writer.send(keepalive)
            continue
        if writer is None:
            first_error = next((d for d in deltas if d.error is not None), None)
            if first_error is not None:
                raise request.record(first_error).error
            writer = await _open_event_stream(http, event_bytes(presenter.opening(request)))
        events: list[Event] = []
        for delta in deltas:
            choice = request.record(delta)
            if choice.error is not None:
                request.finish(RequestStatus.FINISHED_ERROR)
                events += presenter.failure(request, choice.error, record_of(http).id)
                await writer.finish(event_bytes(events))
                return writer.response
            events += presenter.delta(request, choice, delta)
        if request.all_finished:
            request.finish(request.final_status())
            await writer.finish(event_bytes(events + presenter.closing(request)))
            return writer.response
        await writer.send(event_bytes(events))


def _take_text(choice: Choice, text: str) -> bool:
    """A whole response's fast path: keep the text for the end; nothing to wake for."""
    choice.parts.append(text)
    return True


class _EventStream:
    """One response's event stream: OpenAI's chunks, in order, over an SseWriter. Plain text rows are written by
    `fast_text` straight from the worker reader's dispatch; everything else passes through `handle`. A one-choice
    stream of plain text hands its worker the client's socket with the submit (`offer`, ipc/messages.py's Submit),
    with the response's head (its headers and first events): the worker writes the head with the first text and
    every text chunk after it, and sends only the rest: the finish, or a tail it could not write (then this stream
    writes everything again). Until the worker has written, nothing has gone: an error is still a plain JSON error
    with its status."""

    def __init__(self, http: web.Request, request: InferenceRequest, fmt: Format, include_usage: bool,
                 continuous_usage: bool):
        self.http, self.request, self.fmt = http, request, fmt
        self.include_usage, self.continuous_usage = include_usage, continuous_usage
        self.created = now()
        self.writer: SseWriter | None = None
        self.head = b""  # an offered stream's head, for this stream to write where its worker did not
        self.opened = False  # the head went, from here or from the worker
        self.sent_before: int | None = None  # the kernel's count of bytes sent on the connection, at the offer
        self.offsets = [0] * len(request.choices)  # characters streamed per choice, for text completions' logprobs
        created = self.created  # the template's maker holds no reference to this stream: no cycle to collect
        self.templates = ChunkTemplates(
            lambda index, text: fmt.chunk(request, created, index, text, include_usage=include_usage)
        )
        engine = request.choices[0].engine_request
        # Its worker may write it: one choice of plain text, in HTTP chunks, where the audit does not keep its text.
        self.plain = request.attachable and http.version >= HttpVersion11 and len(request.choices) == 1 and \
            not (continuous_usage or engine.logprobs or engine.tool_calls or engine.reasoning)

    async def offer(self) -> tuple[int, bytes, bytes, bytes] | None:
        """For the submit: the client's socket, the response's head and the bytes around a chunk's text, where the
        worker may write this stream (`plain`) and nothing waits to be written on the connection. The response
        is prepared here; its headers wait in the head."""
        if not self.plain:
            return None
        self.writer, headers = await prepare_event_stream(self.http)
        self.head = headers + b"%x\r\n%b\r\n" % (len(first := self._first()), first)
        if (fd := idle_fd(self.http.transport)) is None:
            return None  # bytes wait on the connection: this stream writes everything, the head first
        self.sent_before = bytes_sent(self.http.transport)  # read before the socket goes, for `written`
        return fd, self.head, *self.templates.parts(0)

    def _first(self) -> bytes:
        """The events before any output: each choice's role chunk."""
        return b"".join(
            sse(self.fmt.chunk(self.request, self.created, choice.index, self.request.echo, role=True,
                               include_usage=self.include_usage, continuous_usage=self.continuous_usage))
            for choice in self.request.choices
        )

    async def open(self, written: bool, ending: bool) -> None:
        """Begin the stream at its first output; `written`: its worker wrote the head already; `ending`: the output
        in hand is one row that ends it (an attached stream's usual first row here), a few hundred bytes at most."""
        if self.writer is None:
            self.writer = await _open_event_stream(self.http, self._first())
        else:  # prepared at the offer: the head went from the worker, or goes now
            if not written:
                await self.writer.send_framed(self.head)
            self.http.writer.output_size += len(self.head)  # begun: an error from now on closes the connection
            if not (ending and self.request.attached):  # its worker wrote the rest: this end never waits for room
                watch_stalls(self.http, self.writer.handed_bytes)
        self.opened = True
        if not self.continuous_usage:  # usage on every chunk is rendered in full each time
            self.request.fast_path = self.fast_text

    def written(self, first: TextDelta) -> bool | None:
        """Whether the worker wrote to the client before the first row that came here: a row it sent says so (a
        tail); one made here (its process went away) cannot, so the kernel's count of the bytes sent on the
        connection says. None where that is not known."""
        return True if first.tail is not None else self._sent_since_offer()

    def _sent_since_offer(self) -> bool | None:
        """Whether the kernel sent bytes on the connection since the socket went to the worker (False where it did
        not go); None where that is not known."""
        if not self.request.attached:
            return False
        sent = bytes_sent(self.http.transport)
        return None if sent is None or self.sent_before is None else sent != self.sent_before

    def failed(self, error: Exception) -> None:
        """Before it began, the request failed with `error`, to be answered as a plain JSON error with its status:
        a response prepared for the worker (`offer`) is undone. Where the worker held the socket and the error
        is not its own answer (its process went away, or this process failed) and what it wrote is not known, the
        connection is closed instead."""
        if self.writer is None or self.opened:
            return
        worker_said = isinstance(error, InfernoError) and not isinstance(error, WorkerCrashed)
        if not worker_said and self._sent_since_offer() is not False:
            if self.http.transport is not None:
                self.http.transport.abort()
        else:
            unprepare_event_stream(self.http)

    def fast_text(self, choice: Choice, text: str) -> bool:
        if not text:
            return True
        prefix, suffix = self.templates.parts(choice.index)
        return self.writer.write_parts(prefix, orjson.dumps(text), suffix)

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
            if delta.tail:  # the worker handed the stream back mid-chunk: that chunk's rest first
                await self.writer.send(bytes(out))
                await self.writer.send_framed(delta.tail.encode("latin-1"))
                out.clear()
            if choice.error is not None:
                request.finish(RequestStatus.FINISHED_ERROR)
                error = error_body(choice.error, record_of(self.http).id)  # the id the logs know it by
                await self.writer.finish(bytes(out) + sse(error) + DONE)
                return True
            if delta.text or delta.finish is not None or delta.logprobs or delta.reasoning or delta.tool_calls:
                out += self.chunk(choice, delta)
        if request.all_finished:
            request.finish(request.final_status())
            if self.include_usage:
                out += sse(self.fmt.usage_chunk(request, self.created))
            await self.writer.finish(bytes(out) + DONE)
            return True
        await self.writer.send(bytes(out))
        return False


async def _stream(stream: _EventStream) -> web.StreamResponse:
    """SSE as OpenAI sends it. Headers go out with the first output, so an error before any token is still
    a plain JSON error with its status; after that, an error is an SSE error event."""
    request = stream.request
    while True:
        deltas = await next_deltas(request)
        if not stream.opened:
            written = stream.written(deltas[0]) is True  # its worker wrote to the client: what follows goes after
            first_error = None if written else next((d for d in deltas if d.error is not None), None)
            if first_error is not None:
                raise request.record(first_error).error
            await stream.open(written, ending=len(deltas) == 1 and deltas[0].finish is not None)
        if await stream.handle(deltas):
            return stream.writer.response
