"""How one request is sent and timed: over HTTP to an OpenAI-compatible server. A series sends through a
`Sender`: `prepare` does everything that can be done before the clock starts (JSON bodies, token ids);
`send` only sends and records. (bench/inprocess.py sends the same requests straight into a backend.)"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import orjson

from orchestrator.bench.http_client import ConnectionPool, HttpError, post_pooled, request_head
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.sse import SseCounter
from orchestrator.bench.workload import RequestSpec


class Sender(Protocol):
    def prepare(self, spec: RequestSpec, prompt: str) -> object: ...

    async def send(self, prepared: object) -> RequestTiming: ...


@dataclass(frozen=True)
class RequestShape:
    """What every request of a run asks for besides its prompt and lengths."""

    chat: bool  # /v1/chat/completions, else /v1/completions
    ignore_eos: bool  # ask for exactly max_tokens output tokens
    temperature: float


def request_body(spec: RequestSpec, prompt: str, shape: RequestShape) -> dict:
    """The JSON body of one streaming request."""
    body: dict = {"model": spec.model}
    if shape.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body |= {"max_tokens": spec.osl, "temperature": shape.temperature, "stream": True,
             "stream_options": {"include_usage": True}}
    if shape.ignore_eos:
        body["ignore_eos"] = True
    return body


@dataclass(frozen=True)
class HttpRequest:
    model: str
    data: bytes  # the whole request: head and body


class HttpSender:
    """Streams requests over pooled keep-alive connections, one per request in flight."""

    def __init__(self, api_base: str, shape: RequestShape, timeout_s: float, api_key: str | None = None):
        self.shape = shape
        self._pool = ConnectionPool(api_base)
        self._path = urlsplit(api_base).path.rstrip("/") + ("/chat/completions" if shape.chat else "/completions")
        self._timeout_s = timeout_s
        self._api_key = api_key

    def prepare(self, spec: RequestSpec, prompt: str) -> HttpRequest:
        body = orjson.dumps(request_body(spec, prompt, self.shape))
        return HttpRequest(spec.model, request_head(self._pool.host_header, self._path, len(body), self._api_key) + body)

    async def send(self, request: HttpRequest) -> RequestTiming:
        record = RequestTiming(request.model, time.perf_counter())
        counter = SseCounter(record, self.shape.chat)
        try:
            status, connection = await post_pooled(self._pool, request.data, counter, self._timeout_s)
        except (HttpError, TimeoutError) as exc:
            record.error = str(exc)
            return record
        except OSError as exc:
            record.error = f"cannot connect: {exc}"
            return record
        if status != 200:
            record.error = f"HTTP {status}: {bytes(connection.error_body[:300]).decode(errors='replace')}"
        elif record.end is None:
            record.end = time.perf_counter()  # the stream ended without `data: [DONE]`
        return record

    def close(self) -> None:
        self._pool.close()
