"""When the engine's loop dies, the worker fails the request with a clear error and stops serving, so the
server loads the model afresh. The real hf backend, in-process; its generation loop is stopped underneath it."""

from __future__ import annotations

import asyncio
import socket

import pytest
from tokenizers import Tokenizer

pytest.importorskip("torch")

from orchestrator.backends import hf
from orchestrator.backends.protocol import BackendSettings
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams, TextDelta
from orchestrator.errors import EngineDead
from orchestrator.worker.ipc import Channel
from orchestrator.worker.main import Worker

REQUEST = EngineRequest("r.0", (1, 4093, 198, 6004, 2), max_new_tokens=4, sampling=SamplingParams(temperature=0.0))


async def started_backend(folder):
    backend = hf.create(BackendSettings(folder, load_manifest(folder), kv_cache_bytes=32 * 2**20, threads=1))
    await backend.start()
    return backend


def test_a_stopped_generation_loop_is_reported_as_a_dead_engine(default_engine):
    async def go():
        backend = await started_backend(default_engine)
        try:
            await asyncio.to_thread(backend._manager.stop, block=True)  # the loop is gone
            with pytest.raises(EngineDead, match="generation loop"):
                async for _ in backend.submit(REQUEST):
                    pass
        finally:
            await backend.close()

    asyncio.run(go())


def test_the_worker_fails_the_request_and_stops_serving_when_the_engine_dies(default_engine):
    async def go():
        backend = await started_backend(default_engine)
        await asyncio.to_thread(backend._manager.stop, block=True)
        server_end, worker_end = socket.socketpair()
        server, channel = await Channel.open(server_end), await Channel.open(worker_end)
        worker = Worker(channel, backend, Tokenizer.from_file(str(default_engine / "tokenizer.json")))
        serving = asyncio.create_task(worker.serve())
        server.send({"kind": "submit", "request": REQUEST.to_wire()})
        frame = await asyncio.wait_for(server.recv(), 30)
        await asyncio.wait_for(serving, 30)  # returns by itself: the worker process would now exit
        await backend.close()
        return frame, worker.engine_dead.is_set()

    frame, dead = asyncio.run(go())
    [row] = frame["outputs"]
    delta = TextDelta.from_wire(row)
    assert delta.finish is FinishReason.ERROR and delta.error["kind"] == "EngineDead"
    assert dead
