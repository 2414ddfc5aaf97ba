"""Server-sent events for one response, written the cheap way.

Most chunks of a stream differ only in their text. `ChunkTemplates` renders each choice's chunk once, around a
marker, and keeps the bytes before and after the marker's JSON: a text chunk is then prefix + the text as JSON +
suffix, the same bytes the general renderer (completions_format.Format.chunk) would make. `SseWriter` writes a
chunk to the socket synchronously, in HTTP/1.1 chunked framing (unframed over HTTP/1.0), so the worker reader's
dispatch can stream a step's text to every client without waking one coroutine per request; it reports when the
socket's buffer is congested (the client reads slowly) so the caller can fall back to waiting for the buffer to
drain. `open_event_stream` sends the response's headers in one write with the first events, and `SseWriter.finish`
the last events with the end of the body: two writes (and system calls) per response fewer than headers, chunks and
end each on their own.
"""

from __future__ import annotations

import socket
import sys

import orjson
from aiohttp import HttpVersion11, web

DONE = b"data: [DONE]\n\n"
_MARKER = "\x00inferno-text\x00"


def sse(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def bytes_sent(transport) -> int | None:
    """The bytes the kernel has sent on the connection's socket so far, whichever process wrote them (struct
    tcp_info's tcpi_bytes_sent, Linux 4.19); None where it does not say (the client gone, not TCP)."""
    sock = transport.get_extra_info("socket") if transport is not None and not transport.is_closing() else None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES) if sock is not None else b""
    except OSError:
        return None
    return int.from_bytes(info[_BYTES_SENT_AT : _BYTES_SENT_AT + 8], sys.byteorder) if len(info) >= _TCP_INFO_BYTES \
        else None


_BYTES_SENT_AT = 200  # tcpi_bytes_sent's offset in struct tcp_info
_TCP_INFO_BYTES = _BYTES_SENT_AT + 8


def idle_fd(transport) -> int | None:
    """The connection's socket descriptor, for another process to write chunks to, where nothing is left to write
    here (None: bytes wait in the transport, or the client has gone)."""
    idle = transport is not None and not transport.is_closing() and not transport.get_write_buffer_size()
    return transport.get_extra_info("socket").fileno() if idle else None


class ChunkTemplates:
    """Per choice, the bytes of a plain text chunk around its text."""

    def __init__(self, render) -> None:
        """`render(index, text)` gives the chunk dict for `text` on choice `index` (Format.chunk, bound)."""
        self._render = render
        self._parts: dict[int, tuple[bytes, bytes]] = {}

    def text(self, index: int, text: str) -> bytes:
        prefix, suffix = self.parts(index)
        return prefix + orjson.dumps(text) + suffix

    def parts(self, index: int) -> tuple[bytes, bytes]:
        """The bytes before and after the text (as JSON) in choice `index`'s text chunk."""
        parts = self._parts.get(index)
        if parts is None:
            parts = self._parts[index] = self._split(index)
        return parts

    def _split(self, index: int) -> tuple[bytes, bytes]:
        whole = sse(self._render(index, _MARKER))
        marker = orjson.dumps(_MARKER)
        at = whole.index(marker)
        return whole[:at], whole[at + len(marker) :]


class EventStreamResponse(web.StreamResponse):
    """A chunked response whose headers wait for its first chunk and leave in the same write (aiohttp's
    `web.Response` buffers its headers the same way)."""

    _send_headers_immediately = False


class SseWriter:
    """Writes an open (prepared, uncompressed) event stream without awaiting; `drain` waits when it is congested.
    Chunked over HTTP/1.1; over HTTP/1.0 (nginx's `proxy_pass` by default) the events go as they are, and the
    connection's end ends the body."""

    def __init__(self, response: web.StreamResponse, http: web.Request):
        if response.compression:
            raise ValueError("the event stream must be uncompressed")
        self._response = response
        self._chunked = response.chunked
        self._transport = http.transport
        self.handed = 0  # bytes handed to the transport so far (the stall watch reads it)
        # Congested exactly when the transport pauses its protocol, so `drain` then really waits.
        self._high_water = self._transport.get_write_buffer_limits()[1] if self._transport is not None else 0

    @property
    def response(self) -> web.StreamResponse:
        return self._response

    @property
    def open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def handed_bytes(self) -> int:
        return self.handed

    def write(self, data: bytes) -> bool:
        """Send `data` as one HTTP chunk now; False (nothing sent) if the client has gone or reads too slowly."""
        if not data:
            return True
        transport = self._transport
        if not self._writable(transport):
            return False
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data
        self.handed += len(framed)
        transport.write(framed)
        return True

    def write_parts(self, prefix: bytes, body: bytes, suffix: bytes) -> bool:
        """`write(prefix + body + suffix)`, framed in one go (a templated chunk: ChunkTemplates.parts)."""
        transport = self._transport
        if not self._writable(transport):
            return False
        framed = b"%x\r\n%b%b%b\r\n" % (len(prefix) + len(body) + len(suffix), prefix, body, suffix) \
            if self._chunked else b"%b%b%b" % (prefix, body, suffix)
        self.handed += len(framed)
        transport.write(framed)
        return True

    def _writable(self, transport) -> bool:
        return transport is not None and not transport.is_closing() and (
            transport.get_write_buffer_size() <= self._high_water
        )

    async def drain(self) -> None:
        """Wait until the socket's buffer has room again (the client reads)."""
        await self._response._payload_writer.drain()

    async def send(self, data: bytes) -> None:
        """Send `data`, waiting for room first if needed; ConnectionResetError if the client has gone."""
        if not self.write(data):
            await self._room()
            self.write(data)  # taken: nothing ran between the room and the write

    async def send_framed(self, data: bytes) -> None:
        """Send bytes that are framed already (the rest of a chunk another process began to write)."""
        await self._room()
        self.handed += len(data)
        self._transport.write(data)

    async def _room(self) -> None:
        """Wait until a write would be taken; ConnectionResetError if the client has gone."""
        while not self._writable(self._transport):
            if not self.open:
                raise ConnectionResetError("the client closed the connection")
            await self.drain()

    async def finish(self, data: bytes) -> None:
        """Send `data`, the last events, and the end of the body in one write."""
        await self._room()
        self.handed += _framed_size(data, self._chunked) + (5 if self._chunked else 0)  # and "0\r\n\r\n"
        await self._response.write_eof(data)


async def open_event_stream(http: web.Request, first: bytes) -> SseWriter:
    """Prepare an event stream and send its headers with `first`, the first events, in one write."""
    response = await _prepared(http)
    writer = SseWriter(response, http)
    writer.handed += _framed_size(first, response.chunked)
    await response.write(first)  # the buffered headers go with it
    return writer


async def prepare_event_stream(http: web.Request) -> tuple[SseWriter, bytes]:
    """An event stream prepared for another process to begin (worker/direct.py): its writer, and the bytes of its
    headers, which aiohttp now takes as sent; whoever writes first writes them. Where nothing of it went after all
    (an error before the first token), `unprepare_event_stream` lets another response answer instead."""
    response = await _prepared(http)
    payload = response._payload_writer  # aiohttp's StreamWriter, holding the headers until the first write
    head, payload._headers_buf, payload._headers_written = payload._headers_buf, None, True
    return SseWriter(response, http), head


def unprepare_event_stream(http: web.Request) -> None:
    """Undo `prepare_event_stream`, nothing of the stream having gone: the connection's writer as a response that
    is not yet prepared finds it (no headers, not chunked), for the error's own response."""
    payload = http.writer
    payload._headers_buf, payload._headers_written, payload.chunked = None, False, False


async def _prepared(http: web.Request) -> EventStreamResponse:
    response = EventStreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    if http.version >= HttpVersion11:
        response.enable_chunked_encoding()
    await response.prepare(http)
    return response


def _framed_size(data: bytes, chunked: bool) -> int:
    """The bytes of `data` as one HTTP chunk (its length in hex, CRLF, the data, CRLF), or as it is."""
    return len(b"%x" % len(data)) + len(data) + 4 if chunked and data else len(data)
