"""When the engine's loop dies, the worker fails the request with a clear error and stops serving, so the
server loads the model afresh. The real hf backend, in-process; its generation loop is stopped underneath it."""

from __future__ import annotations

import asyncio
import socket

import pytest
from tokenizers import Tokenizer

pytest.importorskip("torch")

from orchestrator.backends.hf import backend as hf
from orchestrator.backends.options import HfOptions
from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams
from orchestrator.errors import EngineDead
from orchestrator.ipc.channel import Channel
from orchestrator.ipc.messages import Submit, TextDelta
from orchestrator.worker.main import Worker

REQUEST = EngineRequest("r.0", (1, 4093, 198, 6004, 2), max_new_tokens=4, sampling=SamplingParams(temperature=0.0))


async def started_backend(folder, outputs=None):
    backend = hf.create(BackendSettings(folder, load_manifest(folder), 32 * 2**20, HfOptions(threads=1)))
    await backend.start(outputs or RequestStreams(backend))
    return backend


def test_a_stopped_generation_loop_is_reported_as_a_dead_engine(default_engine):
    async def go():
        streams = RequestStreams()
        backend = streams.backend = await started_backend(default_engine, streams)
        try:
            await asyncio.to_thread(backend._manager.stop, block=True)  # the loop is gone
            with pytest.raises(EngineDead, match="generation loop"):
                async for _ in streams.stream(REQUEST):
                    pass
        finally:
            await backend.close()

    asyncio.run(go())


def test_the_worker_fails_the_request_and_stops_serving_when_the_engine_dies(default_engine):
    async def go():
        server_end, worker_end = socket.socketpair()
        server, channel = await Channel.open(server_end), await Channel.open(worker_end)
        tokenizer = Tokenizer.from_file(str(default_engine / "tokenizer.json"))
        backend = hf.create(BackendSettings(default_engine, load_manifest(default_engine), 32 * 2**20, HfOptions(threads=1)))
        worker = Worker(channel, backend, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
        await backend.start(worker)
        await asyncio.to_thread(backend._manager.stop, block=True)
        serving = asyncio.create_task(worker.serve())
        server.send(Submit(REQUEST).to_wire())
        frame = await asyncio.wait_for(server.recv(), 30)
        await asyncio.wait_for(serving, 30)  # returns by itself: the worker process would now exit
        await backend.close()
        return frame, worker.engine_dead.is_set()

    frame, dead = asyncio.run(go())
    [row] = frame["outputs"]
    delta = TextDelta.from_wire(row)
    assert delta.finish is FinishReason.ERROR and delta.error["kind"] == "EngineDead"
    assert dead
