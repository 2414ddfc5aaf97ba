"""An event stream's writes: its headers leave with its first events and its last events with the end of the
body, so a response of N chunks costs N transport writes; the bytes the stall watch is told were handed over
are exactly the body's bytes on the wire. A real aiohttp server and client; the server's transport is wrapped
to record each write."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from orchestrator.api.sse import open_event_stream


class RecordingTransport:
    """The server's transport, every write recorded."""

    def __init__(self, transport):
        self._transport = transport
        self.writes: list[bytes] = []

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def __getattr__(self, name):
        return getattr(self._transport, name)


EVENTS = [b"data: first\n\n", b"data: middle\n\n", b"data: last\n\ndata: [DONE]\n\n"]


def test_headers_go_with_the_first_events_and_the_end_with_the_last():
    seen: dict = {}

    async def handler(http: web.Request) -> web.StreamResponse:
        recorder = RecordingTransport(http.transport)
        http.protocol.transport = recorder  # what the response's writer and the SseWriter both write to
        writer = await open_event_stream(http, EVENTS[0])
        await writer.send(EVENTS[1])
        await writer.finish(EVENTS[2])
        seen.update(writes=recorder.writes, handed=writer.handed)
        return writer.response

    async def scenario() -> bytes:
        app = web.Application()
        app.router.add_get("/events", handler)
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/events")
            assert response.headers["Content-Type"] == "text/event-stream"
            return await response.read()

    body = asyncio.run(scenario())
    assert body == b"".join(EVENTS)
    writes = seen["writes"]
    assert len(writes) == len(EVENTS)
    head, _, first = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert first == b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0])
    assert writes[-1] == b"%x\r\n%b\r\n0\r\n\r\n" % (len(EVENTS[2]), EVENTS[2])
    assert seen["handed"] == sum(len(w) for w in writes) - len(head) - 4  # the body's bytes, headers aside
