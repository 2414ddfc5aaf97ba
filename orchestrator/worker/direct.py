"""A stream whose plain text chunks the worker writes to the client's socket itself (a `Submit` with `attach`).

The HTTP process hands the worker the client's socket with the request, the response's head (its headers and first
events, which aiohttp then takes as sent) and the bytes around a chunk's text. The worker writes the head with the
first text, in one `send`, and from then on frames a chunk per engine step and writes it with one non-blocking
`send`: one process touches each token, and the server sees the request again only at its end (the prompt's cached
tokens, which an engine tells with the first step, go with it). Anything else (a finish, an error, other extras)
goes to the server as a row, which then writes it: the worker wrote everything before it, so order holds. Such a
row says what the worker did: with nothing written (an error before the first token), it is the row as it came
and the server answers as it would have (a plain JSON error with its status); once the head went, it carries a
`tail`, the rest of a chunk the socket did not take whole ("" where all went), and the time of the first token.
A write the socket does not take whole (the client reads slowly, or has gone) ends the attachment the same way:
the server writes the tail, and its own backpressure and stall watch take over.
"""

from __future__ import annotations

import socket
import time

import orjson

from orchestrator.ipc.messages import PLAIN_ROW_LEN, ROW_FINISH, ROW_NUM_TOKENS, ROW_TEXT, TextDelta

_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL  # the socket's blocking mode is the server's; never wait


class DirectStream:
    __slots__ = ("_around", "_frame", "_head", "_send", "_sock", "cached_tokens", "ended", "first_token", "opened",
                 "unreported")

    def __init__(self, fd: int, head: bytes, prefix: bytes, suffix: bytes):
        # Given, not asked of the kernel (three system calls per stream): `send` reads neither (an IPv6 socket too).
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fd)
        self._send = self._sock.send
        self._head, self._around = head, len(prefix) + len(suffix)
        # A chunk's framing around its text, one template (a % in the JSON doubled): one object to read per token.
        self._frame = b"%%x\r\n%b%%b%b\r\n" % (prefix.replace(b"%", b"%%"), suffix.replace(b"%", b"%%"))
        self.unreported = 0  # tokens counted here that no row sent to the server has counted yet
        self.first_token: float | None = None  # when the first of them came (time.monotonic, as the server's)
        self.cached_tokens: int | None = None  # the prompt's tokens the engine's prefix cache served, where it said
        self.opened = False  # the head was written (whole, or its rest is a tail): every row after it says so
        self.ended = False  # handed back to the server (the socket let go)

    def pass_on(self, request_id: str, row: list) -> list | None:
        """What to send the server (a row, TextDelta.to_wire) for request `request_id`'s `row`, if anything. Plain
        text is written to the client (None: nothing to send). Anything else, or a chunk the socket did not take
        whole, goes back to the server with the tokens counted here, and the stream ends here (`ended`: the socket
        is let go)."""
        if row[ROW_FINISH] is None and (len(row) == PLAIN_ROW_LEN or row[PLAIN_ROW_LEN].keys() == {"cached_tokens"}):
            if len(row) > PLAIN_ROW_LEN:  # the prompt's cached tokens (a first step's news): told with the end
                self.cached_tokens = row[PLAIN_ROW_LEN]["cached_tokens"]
            text = row[ROW_TEXT]
            return self.pass_token(request_id, orjson.dumps(text) if text else b"", row[ROW_NUM_TOKENS])
        self.close()
        if not self.opened and not self.unreported and self.cached_tokens is None:
            return row  # nothing written nor counted here: the server takes it as if no socket had come
        delta = TextDelta.from_wire(row)
        delta.num_tokens += self.unreported
        delta.first_token = self.first_token
        if delta.cached_tokens is None:
            delta.cached_tokens = self.cached_tokens
        if self.opened:
            delta.tail = ""
        return delta.to_wire()

    def pass_token(self, request_id: str, body: bytes, tokens: int = 1) -> list | None:
        """`pass_on` for the usual token (SequenceOutput.json): its text, already a JSON string (b"": none), is
        written with no row made. One call per token, the `send` in it: this is the worker's per-token path."""
        if tokens:
            if self.first_token is None:
                self.first_token = time.monotonic()
            self.unreported += tokens
        if not body:
            return None
        framed = self._frame % (self._around + len(body), body)
        if not self.opened:
            framed, self.opened = self._head + framed, True
        try:
            sent = self._send(framed, _FLAGS)
        except OSError:  # full (BlockingIOError) or gone: the server finds out which
            sent = 0
        if sent == len(framed):
            return None
        self.close()  # the socket did not take it whole: the stream goes back to the server with the bytes left
        return TextDelta(request_id, "", self.unreported, cached_tokens=self.cached_tokens,
                         tail=framed[sent:].decode("latin-1"), first_token=self.first_token).to_wire()

    def close(self) -> None:
        self._sock.close()
        self.ended = True
