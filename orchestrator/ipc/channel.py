"""The channel between the HTTP process and a model's worker process: length-prefixed orjson frames over
a Unix socket pair (the child inherits its end).

Each frame is a 4-byte big-endian length and a JSON object with a "kind". The worker sends one "step"
frame per engine step carrying every request's new text, so the HTTP process wakes once per step, not
once per token per request.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import orjson

HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # a prompt of a million tokens fits; anything larger is a bug
_HIGH_WATER = 1 << 20


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
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=2**20)
        return cls(reader, writer)

    async def recv(self) -> dict:
        return await read_frame(self._reader)

    def send(self, message: dict) -> None:
        """Queue a frame; never blocks. Call `drain` where backpressure matters."""
        if self._writer.is_closing():
            raise ChannelClosed("channel is closed")
        self._writer.write(encode_frame(message))

    async def drain(self, force: bool = False) -> None:
        """Wait for queued frames to leave: always with force, else only past the high-water mark."""
        if force or self._writer.transport.get_write_buffer_size() > _HIGH_WATER:
            try:
                await self._writer.drain()
            except ConnectionError as exc:
                raise ChannelClosed(str(exc)) from exc

    def close(self) -> None:
        self._writer.close()
