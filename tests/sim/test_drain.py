"""SIGTERM drains: /ready turns 503 at once, the listener stays open and new requests get 503 with Retry-After,
running streams finish until the one deadline (--drain-timeout-s), a stream still running then ends with an
error event and [DONE], and the process exits soon after. On a simulated engine, so streams last as long as the
test needs."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from tests.conftest import start_server
from tests.sim.conftest import build_fast

pytestmark = pytest.mark.e2e

DRAIN_S = 4.0
SHORT, LONG = 120, 30_000  # tokens: the short streams end well inside the deadline, the long one never would


@pytest.fixture(scope="module")
def engine(sim_engine_dir, tmp_path_factory):
    return build_fast(tmp_path_factory.mktemp("drain-engines"), "sim-drain", "--checkpoint", str(sim_engine_dir),
                      "--sim-speedup", "1", "--sim-param", "load_s=0.05", "--sim-param", "max_batch_size=32")


async def stream(session, url: str, max_tokens: int, started: asyncio.Event) -> list[bytes]:
    body = {"model": "sim-drain", "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True}
    events = []
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                started.set()
    return events


def test_sigterm_drains_then_ends_what_runs_past_the_deadline_and_exits(engine, tmp_path):
    server = start_server(engine.parent, tmp_path / "server.log", "--drain-timeout-s", str(DRAIN_S))

    async def scenario():
        async with aiohttp.ClientSession() as session:
            started = [asyncio.Event() for _ in range(17)]
            tasks = [asyncio.create_task(stream(session, server.base_url, SHORT, started[i])) for i in range(16)]
            tasks.append(asyncio.create_task(stream(session, server.base_url, LONG, started[16])))
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            server.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)  # the signal reaches the server's loop
            async with session.get(f"{server.base_url}/ready") as ready:
                ready_status = ready.status
            body = {"model": "sim-drain", "prompt": "Hi", "max_tokens": 2}
            async with session.post(f"{server.base_url}/v1/completions", json=body) as refused:
                refusal = (refused.status, refused.headers.get("Retry-After"), await refused.json())
            results = await asyncio.wait_for(asyncio.gather(*tasks), DRAIN_S + 30)
            return signalled, ready_status, refusal, results

    signalled, ready_status, refusal, results = asyncio.run(scenario())
    code = server.process.wait(timeout=60)
    exited = time.monotonic() - signalled
    assert ready_status == 503
    assert refusal[0] == 503 and refusal[1] and refusal[2]["error"]["code"] == "shutting_down"
    for events in results[:16]:  # finished normally inside the deadline
        assert events[-1] == b"[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    long = results[16]
    assert long[-1] == b"[DONE]"
    error = json.loads(long[-2])["error"]
    assert error["code"] == "shutting_down" and "deadline" in error["message"]
    assert code == 0
    assert exited < DRAIN_S + 2 + 3  # the deadline, the handlers' farewell, and room for a slow machine
