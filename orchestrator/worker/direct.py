"""A stream whose plain text chunks the worker writes to the client's socket itself (a `Submit` with `attach`).

The HTTP process hands the worker the client's socket with the request, and the bytes around a chunk's text. The
request's first row goes to the server as usual: the server writes the headers and that row, and answers (an
`Attach`) once nothing waits in its socket buffer; meanwhile the worker holds the text back. From then on, each
engine step the worker frames a chunk per attached stream and writes it with one non-blocking `send`: one process
touches each token, instead of the worker sending a row and the HTTP process writing it. Anything but plain text (a
finish, an error, extras) still goes to the server as a row, which then writes it: the worker wrote everything
before it, so order holds. A write the socket does not take whole (the client reads slowly, or has gone) ends the
attachment: the rest of the chunk goes to the server as the row's tail, and the server's own backpressure and stall
watch take over.
"""

from __future__ import annotations

import socket

import orjson

from orchestrator.ipc.messages import PLAIN_ROW_LEN, ROW_FINISH, ROW_NUM_TOKENS, ROW_TEXT, TextDelta

_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL  # the socket's blocking mode is the server's; never wait


class DirectStream:
    __slots__ = ("_around", "_prefix", "_send", "_sock", "_suffix", "attached", "ended", "first", "held",
                 "unreported")

    def __init__(self, fd: int, prefix: str, suffix: str):
        self._sock = socket.socket(fileno=fd)
        self._send = self._sock.send
        self._prefix, self._suffix = prefix.encode(), suffix.encode()
        self._around = len(self._prefix) + len(self._suffix)
        self.unreported = 0  # tokens written or held here that no row sent to the server has counted yet
        self.first = True  # the first row goes to the server (it writes the headers with it)
        self.attached = False  # the server has written every row sent (Attach.seen): text is written here
        self.held = ""  # text held back after the first row, until the server answers (Attach)
        self.ended = False  # handed back to the server (the socket let go)

    def pass_on(self, request_id: str, row: list) -> list | None:
        """What to send the server (a row, TextDelta.to_wire) for request `request_id`'s `row`, if anything.
        The first row is sent as it is. Attached: plain text is written to the client (None: nothing to send).
        Before the server's answer, plain text is held back (`answer`). Anything else, or a chunk the socket did
        not take whole, goes back to the server with the text held and the tokens written or held since the last
        row it got, and the stream ends here (`ended`: the socket is let go)."""
        if self.first and not self.attached and row[ROW_FINISH] is None:
            self.first = False
            return row
        if len(row) == PLAIN_ROW_LEN and row[ROW_FINISH] is None:
            text, self.held = self.held + row[ROW_TEXT], ""
            self.unreported += row[ROW_NUM_TOKENS]
            if not self.attached:
                self.held = text
                return None
            return self._rest(request_id, self.write(orjson.dumps(text)) if text else b"")
        row[ROW_TEXT], row[ROW_NUM_TOKENS] = self.held + row[ROW_TEXT], row[ROW_NUM_TOKENS] + self.unreported
        self.close()
        return row

    def pass_token(self, request_id: str, body: bytes) -> list | None:
        """`pass_on` for the usual token of an attached stream with nothing held (SequenceOutput.json): its text,
        already a JSON string, is written with no row made."""
        self.unreported += 1
        return self._rest(request_id, self.write(body))

    def _rest(self, request_id: str, tail: bytes) -> list | None:
        """After a write (`write`'s answer, `tail`): None where the chunk went whole; else the row that hands the
        stream back to the server with the bytes left."""
        if not tail:
            return None
        self.close()
        return TextDelta(request_id, "", self.unreported, tail=tail.decode("latin-1")).to_wire()

    def answer(self, request_id: str, attach: bool) -> list | None:
        """The server's answer to the first row: `attach` (it has written every row) and the held text is written
        now (returned: the row that hands the stream back, where the socket did not take it whole), or a refusal
        (bytes wait in its socket buffer) and the held text goes back to it as a row (returned), the stream ending
        here."""
        if attach:
            text, self.attached, self.held = self.held, True, ""
            return self._rest(request_id, self.write(orjson.dumps(text))) if text else None
        row, self.held, self.unreported = [request_id, self.held, self.unreported, None, None], "", 0
        self.close()
        return row

    def write(self, body: bytes) -> bytes:
        """Write the chunk whose text is `body` (a JSON string); the bytes the socket did not take (b"" when all
        went)."""
        framed = b"%x\r\n%b%b%b\r\n" % (self._around + len(body), self._prefix, body, self._suffix)
        try:
            sent = self._send(framed, _FLAGS)
        except OSError:  # full (BlockingIOError) or gone: the server finds out which
            sent = 0
        return framed[sent:]

    def close(self) -> None:
        self._sock.close()
        self.ended = True
