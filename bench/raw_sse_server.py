"""The floor for one write per token from Python: an SSE server with no web framework around its writes.

The bare aiohttp server (sse_server.py) measures the client plus aiohttp. This one measures what is left when
nothing of a framework is in the way: a uvloop `asyncio.Protocol` that parses just enough HTTP/1.1 (a request
line, headers, a body of Content-Length bytes, keep-alive) and a step clock whose one callback writes every
stream's chunks for the tick straight to its transport: no task, future or coroutine per stream or per token.
The same events as sse_server.py (its `Chunks`), the same tick rule (every stream gets `burst` tokens a tick,
one chunk each, in one write), headers with the first output. It is a yardstick, not a server: loopback only,
no TLS, no chunked request bodies, and no backpressure (a client that stops reading has its output buffered).

    python -m bench.raw_sse_server [--host 127.0.0.1] [--port 0] [--step-ms 0] [--burst 1]

`python -m bench.baselines --baseline-raw` starts it and runs `inferno bench`'s workload against it.
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from bench.sse_server import READY, Chunks, serve_main

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 4 * 2**20
EVENT_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
MODELS = orjson.dumps({"object": "list", "data": [{"id": "bare-sse", "object": "model", "owned_by": "inferno-bench"}]})


def framed(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def response(status: str, body: bytes, close: bool = False) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def error(status: str, message: str, param: str | None, close: bool = False) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return response(status, orjson.dumps(body), close)


class Stream:
    __slots__ = ("chunks", "left", "opened", "token", "transport")

    def __init__(self, transport: asyncio.Transport, chunks: Chunks, tokens: int):
        self.transport, self.chunks, self.left, self.opened = transport, chunks, tokens, False
        self.token = framed(chunks.token)  # a tick's write when it hands out one token


class StepClock:
    """Every tick, each stream in flight gets `burst` tokens (fewer at its end), written in one go."""

    def __init__(self, step_s: float, burst: int):
        self.step_s, self.burst = step_s, burst
        self.streams: list[Stream] = []
        self._loop = asyncio.get_running_loop()
        self._deadline = 0.0
        self._ticking = False

    def add(self, stream: Stream) -> None:
        self.streams.append(stream)
        if not self._ticking:  # the first tick comes at once, as sse_server.py's clock wakes
            self._ticking = True
            self._deadline = self._loop.time()
            self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        kept = []
        for stream in self.streams:
            transport = stream.transport
            if transport.is_closing():
                continue  # the client went away
            count = min(self.burst, stream.left)
            stream.left -= count
            if stream.opened and stream.left and count == 1:
                transport.write(stream.token)  # the common case: one token, mid-stream
            else:
                transport.write(self._output(stream, count))
            if stream.left:
                kept.append(stream)
        self.streams = kept
        if kept:
            self._deadline += self.step_s  # a late tick is caught up at once, as sse_server.py's clock does
            self._loop.call_at(self._deadline, self._tick)
        else:
            self._ticking = False

    @staticmethod
    def _output(stream: Stream, count: int) -> bytes:
        chunks, head = stream.chunks, b""
        events = chunks.token * (count - 1 if not stream.left else count)
        if not stream.opened:  # headers go out with the first output, as Inferno sends them
            stream.opened, head, events = True, EVENT_STREAM_HEAD, chunks.first + events
        if not stream.left:
            return head + framed(events + chunks.last + chunks.end) + b"0\r\n\r\n"
        return head + framed(events)


class Connection(asyncio.Protocol):
    def __init__(self, clock: StepClock):
        self.clock = clock
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer and not self.transport.is_closing() and self._next_request():
            pass

    def _next_request(self) -> bool:
        """Answer the request at the head of the buffer if it is all there; False to wait for more bytes."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self._refuse("431 Request Header Fields Too Large", "the request head is too large")
            return False
        try:
            method, path, headers = parse_head(self.buffer[:end])
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            self._refuse("400 Bad Request", str(exc))
            return False
        if "transfer-encoding" in headers:
            self._refuse("411 Length Required", "send the body with a Content-Length")
            return False
        if not 0 <= length <= MAX_BODY_BYTES:
            self._refuse("413 Payload Too Large", f"a body of {length} bytes: at most {MAX_BODY_BYTES}")
            return False
        if len(self.buffer) < end + 4 + length:
            return False  # the rest of the body is still on its way
        body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
        self._handle(method, path, body)
        return True

    def _refuse(self, status: str, message: str) -> None:
        """Answer with an error and close the connection (what follows in the buffer cannot be trusted)."""
        self.transport.write(error(status, message, None, close=True))
        self.transport.close()

    def _handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/v1/models":
            self.transport.write(response("200 OK", MODELS))
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self._generate(body, chat=path == "/v1/chat/completions")
        else:
            self.transport.write(error("404 Not Found", f"no {method} {path} here", None))

    def _generate(self, raw: bytes, chat: bool) -> None:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.transport.write(error("400 Bad Request", "the body is not JSON", None))
            return
        tokens = body.get("max_tokens") or body.get("max_completion_tokens") if isinstance(body, dict) else None
        if not (isinstance(body, dict) and body.get("stream")):
            self.transport.write(error("400 Bad Request", "the raw SSE server only streams: set stream to true",
                                       "stream"))
        elif not isinstance(tokens, int) or tokens < 1:
            self.transport.write(error("400 Bad Request", "max_tokens: give the number of tokens to stream (at "
                                       "least 1)", "max_tokens"))
        else:
            self.clock.add(Stream(self.transport, Chunks(body, chat, tokens), tokens))


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, path, headers by lower-case name) of a request head without its blank line; ValueError if it
    is not HTTP/1.1."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] != "HTTP/1.1":
        raise ValueError(f"not an HTTP/1.1 request line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"not a header: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


async def _serve(host: str, port: int, step_ms: float, burst: int) -> None:
    if step_ms < 0 or burst < 1:
        raise ValueError(f"step_ms must be >= 0 and burst >= 1 (got {step_ms}, {burst})")
    clock = StepClock(step_ms / 1000, burst)
    server = await asyncio.get_running_loop().create_server(lambda: Connection(clock), host, port)
    bound = server.sockets[0].getsockname()
    print(f"{READY}http://{bound[0]}:{bound[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    return serve_main("python -m bench.raw_sse_server", __doc__.splitlines()[0], _serve, argv)


if __name__ == "__main__":
    sys.exit(main())
