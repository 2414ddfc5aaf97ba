"""An agent API's stream whose first output takes long (a long prompt's prefill on a slow device) opens before it
and sends keepalives while there is none: Anthropic's `ping` events on the Messages API, SSE comments on the
Responses API. Clients with an idle timeout on the stream (Claude Code's is five minutes) then wait for it."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from orchestrator.api import generation
from orchestrator.engine.request import FinishReason
from tests.app.harness import running_app

BODIES = {
    "/v1/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "stream": True},
    "/v1/responses": {"input": "Hi", "stream": True},
}


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_slow_first_output_is_preceded_by_the_opening_events_and_keepalives(catalogue, monkeypatch, path):
    monkeypatch.setattr(generation, "KEEPALIVE_S", 0.05)

    marker = b"event: ping" if path == "/v1/messages" else b": keepalive"

    async def go():
        async with running_app(catalogue) as app:
            asking = asyncio.create_task(app.client.post(path, json={"model": app.model, **BODIES[path]}))
            worker, request = await app.workers.next_submit()
            reply = await asking  # the headers come with the stream's opening, before any output
            seen = b""
            while seen.count(marker) < 4:  # the prefill goes on: keepalives, and still no output
                seen += await reply.content.readany()
            worker.emit(request.id, "Hello", tokens=1, finish=FinishReason.STOP)
            return reply.status, seen + await reply.read()

    status, raw = asyncio.run(go())
    blocks = raw.decode().strip().split("\n\n")
    names = ["comment" if b.startswith(":") else b.split("\n")[0].removeprefix("event: ") for b in blocks]
    keepalive = "ping" if path == "/v1/messages" else "comment"
    first_output = next(i for i, b in enumerate(blocks) if "Hello" in b)
    assert status == 200
    assert names[:2] == (["message_start", "ping"] if path == "/v1/messages" else ["response.created",
                                                                                    "response.in_progress"])
    assert names[2:first_output].count(keepalive) >= 3, names  # one per quiet period before the output
    if path == "/v1/responses":  # the events' sequence numbers are not disturbed by the comments
        numbers = [orjson.loads(b.split("\n")[1].removeprefix("data: "))["sequence_number"]
                   for b in blocks if not b.startswith(":")]
        assert numbers == list(range(len(numbers)))
