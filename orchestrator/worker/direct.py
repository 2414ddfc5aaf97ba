"""A stream whose plain text chunks the worker writes to the client's socket itself (an `Attach`), per token.

The HTTP process opens the stream (headers, the first events) and then hands the worker the socket with the bytes
around a chunk's text. Each engine step the worker frames a chunk per attached stream and writes it with one
non-blocking `send`: one process touches each token, instead of the worker sending a row and the HTTP process
writing it. Anything but plain text (a finish, an error, extras) still goes to the server as a row, which then
writes it: the worker wrote everything before it, so order holds. A write the socket does not take whole (the
client reads slowly, or has gone) ends the attachment: the rest of the chunk goes to the server as the row's tail,
and the server's own backpressure and stall watch take over.
"""

from __future__ import annotations

import socket

import orjson

_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL  # the socket's blocking mode is the server's; never wait


class DirectStream:
    __slots__ = ("_prefix", "_sock", "_suffix", "attached", "held", "holds", "unreported")

    def __init__(self, fd: int, prefix: str, suffix: str):
        self._sock = socket.socket(fileno=fd)
        self._prefix, self._suffix = prefix.encode(), suffix.encode()
        self.unreported = 0  # tokens written here that no row sent to the server has counted yet
        self.attached = False  # offered until the server has written every row sent (Attach.seen)
        self.held, self.holds = "", 0  # text held back while offered, and for how many rows

    def write(self, text: str) -> bytes:
        """Write `text` as one chunk; the bytes the socket did not take (b"" when all went)."""
        body = orjson.dumps(text)
        framed = b"%x\r\n%b%b%b\r\n" % (len(self._prefix) + len(body) + len(self._suffix), self._prefix, body,
                                      self._suffix)
        try:
            sent = self._sock.send(framed, _FLAGS)
        except OSError:  # full (BlockingIOError) or gone: the server finds out which
            sent = 0
        return framed[sent:]

    def close(self) -> None:
        self._sock.close()
