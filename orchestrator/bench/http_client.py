"""A lean HTTP/1.1 client for streaming POSTs, so that the load generator is never the bottleneck.

One asyncio Protocol per keep-alive connection hands each read's body bytes, with one timestamp, straight to
a sink (an SseCounter): no task wake-up per read, no header objects, no JSON per chunk. It speaks just what
OpenAI-compatible servers answer with: a status line, headers, then a chunked, length-delimited or
close-delimited body.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit


class BodySink(Protocol):
    def feed(self, data: bytes, now: float) -> None: ...


class HttpError(Exception):
    """The connection failed or the response could not be read."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; `post` sends one request and resolves when its response has ended."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False  # the last response ended cleanly and the server keeps the connection
        self.status = 0
        self.error_body = bytearray()  # the body of a response other than 200
        self.received_any = False  # any byte of the current response arrived
        self._done: asyncio.Future[int] | None = None
        self._sink: BodySink | None = None
        self._head = b""
        self._mode = ""  # "chunked" | "length" | "close"
        self._left = 0  # bytes left in the current chunk, or of a length-delimited body
        self._pending = b""  # an incomplete chunk-size line or CRLF
        self._after_data = False  # a chunk's data ended: its CRLF comes next
        self._trailers = False  # the last chunk arrived: trailers until an empty line
        self._keep_alive = True

    # -- asyncio.Protocol -------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._done is None or self._done.done():
            return
        if self._mode == "close" and self.status:
            self._done.set_result(self.status)
        else:
            self._done.set_exception(HttpError(f"the server closed the connection mid-response ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.received_any = True
        if not self.status:
            head = self._head + data
            end = head.find(b"\r\n\r\n")
            if end == -1:
                self._head = head
                return
            self._head, data = b"", head[end + 4 :]
            if not self._read_head(head[:end]):
                return
        if data and self._done is not None and not self._done.done():
            self._read_body(data, now)

    # -- one request ------------------------------------------------------------------------------------------
    async def post(self, request: bytes, sink: BodySink, timeout_s: float) -> int:
        """Send `request` (head and body bytes) and feed a 200 response's body to `sink`; returns the status.
        A non-200 body is kept in `error_body`. Raises HttpError or TimeoutError."""
        if self.closed or self.transport is None:
            raise HttpError("the connection is closed")
        loop = asyncio.get_running_loop()
        self._start(sink, loop.create_future())
        self.transport.write(request)
        timer = loop.call_later(timeout_s, self._time_out, timeout_s)
        try:
            return await self._done
        finally:
            timer.cancel()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _start(self, sink: BodySink, done: asyncio.Future) -> None:
        self._sink, self._done = sink, done
        self.status, self.error_body, self.received_any, self.reusable = 0, bytearray(), False, False
        self._mode, self._left, self._pending, self._after_data, self._trailers = "", 0, b"", False, False

    def _time_out(self, timeout_s: float) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(TimeoutError(f"no complete response within {timeout_s} s"))
            self.close()

    def _finish(self) -> None:
        self.reusable = self._keep_alive and not self.closed
        if self._done is not None and not self._done.done():
            self._done.set_result(self.status)

    # -- parsing ----------------------------------------------------------------------------------------------
    def _read_head(self, head: bytes) -> bool:
        """Status and framing from the response head; False when the response is already complete."""
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        try:
            self.status = int(rest[:3])
        except ValueError:
            self._fail(f"not an HTTP response: {lines[0][:80]!r}")
            return False
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        connection = headers.get(b"connection", b"")
        self._keep_alive = connection != b"close" and (version == b"HTTP/1.1" or connection == b"keep-alive")
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self._mode = "chunked"
        elif b"content-length" in headers:
            self._mode, self._left = "length", int(headers[b"content-length"])
            if self._left == 0:
                self._finish()
                return False
        else:
            self._mode, self._keep_alive = "close", False
        return True

    def _fail(self, message: str) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(HttpError(message))
        self.close()

    def _deliver(self, payload: bytes, now: float) -> None:
        if self.status == 200:
            self._sink.feed(payload, now)
        else:
            self.error_body += payload

    def _read_body(self, data: bytes, now: float) -> None:
        if self._mode == "chunked":
            self._read_chunked(data, now)
        elif self._mode == "length":
            payload = data[: self._left]
            self._left -= len(payload)
            self._deliver(payload, now)
            if not self._left:
                self._finish()
        else:
            self._deliver(data, now)

    def _read_chunked(self, data: bytes, now: float) -> None:
        """Strip chunked framing; whatever the read held goes to the sink in one call."""
        if not (self._pending or self._left or self._after_data or self._trailers):
            # The common read: exactly one whole chunk, as a server writes one per flush.
            line_end = data.find(b"\r\n", 0, 18)
            if line_end > 0 and data.endswith(b"\r\n"):
                try:
                    size = int(data[:line_end], 16)
                except ValueError:  # chunk extensions: the general path below reads them
                    size = 0
                if size and len(data) == line_end + size + 4:
                    self._deliver(data[line_end + 2 : -2], now)
                    return
        buffer = self._pending + data if self._pending else data
        position, size, pieces = 0, len(buffer), []
        while position < size:
            if self._left:
                end = min(size, position + self._left)
                pieces.append(buffer[position:end])
                self._left -= end - position
                position = end
                self._after_data = not self._left
                continue
            line_end = buffer.find(b"\r\n", position)
            if line_end == -1:
                break
            line, position = buffer[position:line_end], line_end + 2
            if self._after_data:
                self._after_data = False
            elif self._trailers:
                if not line:
                    self._pending = b""
                    if pieces:
                        self._deliver(b"".join(pieces), now)
                    self._finish()
                    return
            else:
                self._left = int(line.split(b";", 1)[0], 16)
                self._trailers = self._left == 0
        self._pending = buffer[position:]
        if pieces:
            self._deliver(b"".join(pieces), now)


class ConnectionPool:
    """Keep-alive connections to one server, opened as needed and reused when idle."""

    def __init__(self, base_url: str):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url must be http://host:port or https://host:port (got {base_url!r})")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._idle: list[Connection] = []
        self.opened = 0

    async def acquire(self) -> tuple[Connection, bool]:
        """An idle connection (reused=True) or a new one."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection, True
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(Connection, self.host, self.port, ssl=self._ssl)
        self.opened += 1
        return connection, False

    def release(self, connection: Connection) -> None:
        if connection.reusable and not connection.closed:
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


async def post_pooled(pool: ConnectionPool, request: bytes, sink: BodySink, timeout_s: float) -> tuple[int, Connection]:
    """Send `request` on one of the pool's connections (see Connection.post): the status, and the connection,
    back in the pool when its response ended cleanly (closed otherwise). A kept-alive connection the server
    had closed meanwhile, before answering anything, is left for another. Raises OSError when no connection
    can be made, HttpError or TimeoutError."""
    while True:
        connection, reused = await pool.acquire()
        try:
            status = await connection.post(request, sink, timeout_s)
        except HttpError:
            connection.close()
            if reused and not connection.received_any:
                continue
            raise
        pool.release(connection)
        return status, connection


def request_head(host_header: str, path: str, body_length: int, api_key: str | None) -> bytes:
    """The head of a JSON POST that asks for an event stream."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host_header}", "Content-Type: application/json",
             "Accept: text/event-stream", f"Content-Length: {body_length}"]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
