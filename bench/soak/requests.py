"""The generation requests a soak run sends, each checked for what it must come back with.

- a stream must end with `data: [DONE]` after a chunk that carries a finish reason (`stop` or `length`),
  with no error event;
- a non-streaming answer must be a completion object whose choice has a finish reason;
- a stream the client cuts (after a random number of events, or after a random delay) must simply end:
  its connection is closed by the client, the server has to notice and free what the request held (the
  quiet period after the run checks that nothing stayed in flight).

Requests go out over the benchmark's lean HTTP client (http_client.py): pooled keep-alive connections for
whole requests, a fresh connection for each one the client cuts.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import orjson

from orchestrator.bench.http_client import Connection, ConnectionPool, HttpError, post_pooled, request_head
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.senders import RequestShape, request_body
from orchestrator.bench.sse import SseCounter
from orchestrator.bench.workload import RequestSpec

FINISH_REASONS = ("stop", "length")
_FINISH = re.compile(rb'"finish_reason":\s*"([a-z_]+)"')


@dataclass(frozen=True)
class Outcome:
    """What one request (or admin call, or probe) found. `failure` is a short label that failures are counted
    by ("HTTP 503", "no [DONE]"); None when the server answered as it must. `note` names an expected variant
    ("cut", "ended before its cut", "refused: busy")."""

    kind: str
    failure: str | None = None
    detail: str = ""
    note: str | None = None


@dataclass(frozen=True)
class PlannedRequest:
    """One generation request, decided from the seed before it is sent."""

    model: str
    prompt: str
    max_tokens: int
    chat: bool
    stream: bool
    seed: int
    cut_after_events: int | None = None  # cut the stream once this many data events arrived
    cut_after_s: float | None = None  # or this long after sending


class CheckedStream(SseCounter):
    """An SseCounter that also remembers the finish reason and can cut its connection at a planned point."""

    __slots__ = ("connection", "cut", "cut_after_events", "finish_reason")

    def __init__(self, record: RequestTiming, chat: bool, cut_after_events: int | None):
        super().__init__(record, chat)
        self.connection: Connection | None = None
        self.cut_after_events = cut_after_events
        self.cut = False
        self.finish_reason: str | None = None

    def _event(self, event: bytes, now: float) -> None:
        super()._event(event, now)
        match = _FINISH.search(event)
        if match:
            self.finish_reason = match.group(1).decode()
        if self.cut_after_events is not None and self.record.events >= self.cut_after_events and not self.done:
            self.cut_now()

    def cut_now(self) -> None:
        if self.connection is not None and not self.done:
            self.cut = True
            self.connection.close()


class Body:
    """Collects a whole (non-streamed) response body."""

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, data: bytes, now: float) -> None:
        self.data += data


def _payload(generation: PlannedRequest) -> bytes:
    shape = RequestShape(chat=generation.chat, ignore_eos=False, temperature=0.7)
    body = request_body(RequestSpec(0, generation.model, 0, generation.max_tokens), generation.prompt, shape)
    body["seed"] = generation.seed
    if not generation.stream:
        body["stream"] = False
        del body["stream_options"]
    return orjson.dumps(body)


def _request(pool: ConnectionPool, generation: PlannedRequest) -> bytes:
    body = _payload(generation)
    path = "/v1/chat/completions" if generation.chat else "/v1/completions"
    return request_head(pool.host_header, path, len(body), None) + body


def _status_failure(kind: str, status: int, body: bytes | bytearray) -> Outcome:
    return Outcome(kind, f"HTTP {status}", bytes(body[:200]).decode(errors="replace"))


def _check_stream(kind: str, stream: CheckedStream, note: str | None = None) -> Outcome:
    """A stream that ended: it must have ended with [DONE], a finish reason and no error event."""
    if stream.record.error:
        return Outcome(kind, "error event in the stream", stream.record.error[:200])
    if not stream.done:
        return Outcome(kind, "no [DONE]", f"{stream.record.events} events, finish reason {stream.finish_reason}")
    if stream.finish_reason not in FINISH_REASONS:
        return Outcome(kind, "no finish reason" if stream.finish_reason is None else f"finish {stream.finish_reason}")
    return Outcome(kind, note=note)


async def send_stream(pool: ConnectionPool, generation: PlannedRequest, timeout_s: float) -> Outcome:
    """A stream read to its end on a pooled connection."""
    stream = CheckedStream(RequestTiming(generation.model, time.perf_counter()), generation.chat, None)
    try:
        status, connection = await post_pooled(pool, _request(pool, generation), stream, timeout_s)
    except (HttpError, OSError) as exc:  # TimeoutError is an OSError
        return Outcome("stream", type(exc).__name__, str(exc)[:200])
    if status != 200:
        return _status_failure("stream", status, connection.error_body)
    return _check_stream("stream", stream)


async def send_complete(pool: ConnectionPool, generation: PlannedRequest, timeout_s: float) -> Outcome:
    """A non-streaming request: one JSON completion with a finish reason."""
    body = Body()
    try:
        status, connection = await post_pooled(pool, _request(pool, generation), body, timeout_s)
    except (HttpError, OSError) as exc:
        return Outcome("complete", type(exc).__name__, str(exc)[:200])
    if status != 200:
        return _status_failure("complete", status, connection.error_body)
    try:
        answer = orjson.loads(body.data)
        finish = answer["choices"][0]["finish_reason"]
        expected = "chat.completion" if generation.chat else "text_completion"
        if answer["object"] != expected:
            return Outcome("complete", f"object {answer['object']!r}")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return Outcome("complete", "not a completion", bytes(body.data[:200]).decode(errors="replace"))
    return Outcome("complete") if finish in FINISH_REASONS else Outcome("complete", f"finish {finish}")


async def send_cut(pool: ConnectionPool, generation: PlannedRequest, timeout_s: float) -> Outcome:
    """A stream the client cuts at its planned point, on a connection of its own."""
    stream = CheckedStream(RequestTiming(generation.model, time.perf_counter()), generation.chat,
                           generation.cut_after_events)
    loop = asyncio.get_running_loop()
    try:
        _, connection = await loop.create_connection(Connection, pool.host, pool.port)
    except OSError as exc:
        return Outcome("cut", "cannot connect", str(exc)[:200])
    stream.connection = connection
    timer = None if generation.cut_after_s is None else loop.call_later(generation.cut_after_s, stream.cut_now)
    try:
        status = await connection.post(_request(pool, generation), stream, timeout_s)
    except HttpError as exc:
        if stream.cut:
            return Outcome("cut", note="cut")
        return Outcome("cut", "HttpError", str(exc)[:200])
    except TimeoutError as exc:
        return Outcome("cut", "TimeoutError", str(exc)[:200])
    finally:
        if timer is not None:
            timer.cancel()
        connection.close()
    if status != 200:
        return _status_failure("cut", status, connection.error_body)
    return _check_stream("cut", stream, note="ended before its cut")
