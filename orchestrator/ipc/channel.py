"""The channel between the HTTP process and a model's worker process: length-prefixed orjson frames over
a Unix socket pair (the child inherits its end).

Each frame is a 4-byte big-endian length and a JSON object with a "kind". The worker sends one "step"
frame per engine step carrying every request's new text, so the HTTP process wakes once per step, not
once per token per request. The worker's side sends from any thread, each frame whole and in the order sent, as
soon as it is sent (an engine's own thread writes its step frames without waking the worker's event loop); the
HTTP process's side gathers the frames it sends in one turn of its event loop and writes them in one write to its
transport at the turn's end, or as soon as one is sent GATHER_S after the first: a wave of new requests, prepared
one after another in one turn, wakes a worker about once per GATHER_S rather than once per submit, and a submit
is not held back behind the whole wave's preparation (that cost 20% of TTFT at 128 streams).
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
import time

import orjson

HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # a prompt of a million tokens fits; anything larger is a bug
_HIGH_WATER = 1 << 20
GATHER_S = 0.001  # the longest a frame of the HTTP process's waits for others to go with it


class ChannelClosed(Exception):
    """The other side went away (process exit or socket closed)."""


class FrameTooLarge(Exception):
    pass


def encode_frame(message: dict) -> bytes:
    body = orjson.dumps(message)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> dict:
    """The next message; ChannelClosed at a clean or mid-frame end of stream."""
    try:
        header = await reader.readexactly(HEADER.size)
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise FrameTooLarge(f"incoming frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
        return orjson.loads(await reader.readexactly(length))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise ChannelClosed(str(exc)) from exc


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 sock: socket.socket | None = None):
        self._reader = reader
        self._writer = writer
        self._sock = sock  # given: frames go out through it directly, from any thread
        self._sending = threading.Lock()
        self._gathered: list[bytes] = []  # frames sent since `_since`, written at the turn's end or after GATHER_S
        self._since = 0.0

    @classmethod
    async def open(cls, sock: socket.socket, any_thread: bool = False) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=2**20)
        return cls(reader, writer, sock if any_thread else None)

    async def recv(self) -> dict:
        return await read_frame(self._reader)

    def send(self, message: dict) -> None:
        """Send a frame: queued in the transport (never blocks), or, on a channel opened for any thread, written
        now, waiting while the socket is full."""
        if self._sock is None:
            if self._writer.is_closing():
                raise ChannelClosed("channel is closed")
            self._gathered.append(encode_frame(message))
            if len(self._gathered) == 1:
                self._since = time.monotonic()
                asyncio.get_running_loop().call_soon(self._write_gathered)
            elif time.monotonic() - self._since >= GATHER_S:
                self._write_gathered()
            return
        view = memoryview(encode_frame(message))
        with self._sending:
            try:
                while view:
                    try:
                        view = view[self._sock.send(view):]
                    except BlockingIOError:
                        writable = select.poll()
                        writable.register(self._sock, select.POLLOUT)
                        writable.poll()
            except (OSError, ValueError) as exc:  # the other side went away, or this one closed
                raise ChannelClosed(str(exc)) from exc

    def _write_gathered(self) -> None:
        frames, self._gathered = self._gathered, []
        if frames and not self._writer.is_closing():
            self._writer.write(b"".join(frames))

    async def drain(self, force: bool = False) -> None:
        """Wait for queued frames to leave: always with force, else only past the high-water mark."""
        if self._sock is not None:
            return  # nothing is queued
        self._write_gathered()
        if force or self._writer.transport.get_write_buffer_size() > _HIGH_WATER:
            try:
                await self._writer.drain()
            except ConnectionError as exc:
                raise ChannelClosed(str(exc)) from exc

    def close(self) -> None:
        self._write_gathered()  # frames sent just before (a shutdown) still go
        self._writer.close()
