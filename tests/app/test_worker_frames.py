"""Malformed frames at the worker boundary, on both sides of a real socket pair: the worker fails only the request
whose submit it cannot read and goes on serving (the real hf backend, in-process); the server ends a worker that
sends nonsense as if it had crashed (a real child process stands for the worker, the test speaks its part)."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest
from tokenizers import Tokenizer

pytest.importorskip("torch")

from orchestrator.backends.hf import backend as hf
from orchestrator.backends.options import HfOptions
from orchestrator.backends.protocol import BackendSettings
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams
from orchestrator.errors import ModelUnavailable, WorkerCrashed
from orchestrator.ipc.channel import Channel
from orchestrator.ipc.messages import (
    Idle,
    LoadReport,
    LoadSpec,
    Release,
    Shutdown,
    Step,
    Submit,
    TextDelta,
    WorkerReady,
    decode_from_worker,
    decode_to_worker,
)
from orchestrator.supervisor.client import WorkerClient
from orchestrator.supervisor.process import WorkerProcess
from orchestrator.worker.main import Worker

GOOD = EngineRequest("good.0", (1, 4093, 198, 6004, 2), max_new_tokens=2, sampling=SamplingParams(temperature=0.0))


async def channel_pair() -> tuple[Channel, Channel]:
    server_end, worker_end = socket.socketpair()
    return await Channel.open(server_end), await Channel.open(worker_end)


def test_the_worker_fails_only_the_request_whose_submit_it_cannot_read(default_engine):
    async def go():
        server, channel = await channel_pair()
        tokenizer = Tokenizer.from_file(str(default_engine / "tokenizer.json"))
        settings = BackendSettings(default_engine, load_manifest(default_engine), 32 * 2**20, HfOptions(threads=1))
        backend = hf.create(settings)
        worker = Worker(channel, backend, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
        await backend.start(worker)
        serving = asyncio.create_task(worker.serve())
        unreadable = {**GOOD.to_wire(), "id": "bad.0"}
        del unreadable["sampling"]
        server.send({"kind": "submit", "request": unreadable})
        server.send({"kind": "cancel", "id": None})  # logged and left alone
        server.send(Submit(GOOD).to_wire())
        rows = []
        while not any(row[0] == "good.0" and row[3] is not None for row in rows):
            rows += decode_from_worker(await asyncio.wait_for(server.recv(), 60)).rows
        server.send(Shutdown().to_wire())
        await asyncio.wait_for(serving, 30)
        await backend.close()
        return [TextDelta.from_wire(row) for row in rows]

    deltas = asyncio.run(go())
    bad, good = deltas[0], [d for d in deltas if d.request_id == "good.0"]
    assert bad.request_id == "bad.0" and bad.finish is FinishReason.ERROR and bad.error["kind"] == "EngineError"
    assert "the engine refused the request" in bad.error["message"] and "sampling" in bad.error["message"]
    assert sum(d.num_tokens for d in good) == 2 and good[-1].finish is FinishReason.LENGTH


async def standing_in_worker() -> tuple[WorkerProcess, Channel]:
    """A real child process (it only waits) whose channel the test speaks through."""
    server, worker = await channel_pair()
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(600)")
    return WorkerProcess(process, server), worker


def spec_for(default_engine) -> LoadSpec:
    return LoadSpec(str(default_engine), 32 * 2**20, HfOptions())


def test_the_server_ends_a_worker_that_sends_a_malformed_frame_and_fails_its_requests(default_engine):
    async def go():
        process, worker = await standing_in_worker()
        exits, ended = [], asyncio.get_running_loop().create_future()
        client = WorkerClient("smollm2-135m", process, exits.append)
        starting = asyncio.create_task(client.start(spec_for(default_engine), 30))
        worker.send(Idle(process.pid).to_wire())
        load = decode_to_worker(await worker.recv())
        worker.send(WorkerReady(process.pid, 10**8, LoadReport("cpu")).to_wire())
        ready = await starting
        client.submit(GOOD, ended.set_result)
        submitted = decode_to_worker(await worker.recv())
        worker.send({"kind": "step", "outputs": [[7, "not a request id", 1, None, None]]})
        row = await asyncio.wait_for(ended, 30)
        code = await asyncio.wait_for(process.process.wait(), 30)
        return load, ready, submitted, TextDelta.from_wire(row), exits, code, client.alive

    load, ready, submitted, delta, exits, code, alive = asyncio.run(go())
    assert load == spec_for(default_engine) and submitted == Submit(GOOD) and ready.load.device == "cpu"
    assert delta.finish is FinishReason.ERROR and delta.error["kind"] == WorkerCrashed.__name__
    assert exits == ["smollm2-135m"] and code < 0 and not alive  # killed, and the scheduler told


def test_a_worker_that_answers_its_load_with_something_else_is_ended(default_engine):
    async def go():
        process, worker = await standing_in_worker()
        client = WorkerClient("smollm2-135m", process, lambda model: None)
        starting = asyncio.create_task(client.start(spec_for(default_engine), 30))
        await worker.recv()
        worker.send(Step([]).to_wire())
        with pytest.raises(ModelUnavailable) as refused:
            await starting
        return refused.value, await asyncio.wait_for(process.process.wait(), 30)

    error, code = asyncio.run(go())
    assert "failed while loading (it answered with a malformed message)" in error.message and code < 0


async def loaded_client(default_engine, reusable: bool) -> tuple[WorkerClient, WorkerProcess, Channel, list]:
    process, worker = await standing_in_worker()
    exits: list[str] = []
    client = WorkerClient("smollm2-135m", process, exits.append)
    starting = asyncio.create_task(client.start(spec_for(default_engine), 30))
    await worker.recv()
    worker.send(WorkerReady(process.pid, 10**8, LoadReport("cpu", reusable=reusable)).to_wire())
    await starting
    return client, process, worker, exits


@pytest.mark.parametrize("answers", ["idle", "nothing"])
def test_a_released_worker_that_says_idle_is_handed_back_and_one_that_does_not_is_killed(default_engine, answers):
    async def go():
        client, process, worker, exits = await loaded_client(default_engine, reusable=True)
        releasing = asyncio.create_task(client.release(timeout_s=2))
        asked = decode_to_worker(await worker.recv())
        if answers == "idle":
            worker.send(Idle(process.pid).to_wire())
        handed_back = await releasing
        code = process.process.returncode if answers == "idle" else await process.process.wait()
        if handed_back is not None:
            await handed_back.kill()
        return asked, handed_back, exits, client.alive, code

    asked, handed_back, exits, alive, code = asyncio.run(go())
    assert asked == Release() and exits == ["smollm2-135m"] and not alive
    if answers == "idle":
        assert handed_back is not None and code is None  # the same process, alive, its channel open for a load
    else:
        assert handed_back is None and code < 0


def test_a_worker_whose_backend_cannot_give_its_memory_back_is_stopped_not_released(default_engine):
    async def go():
        client, process, worker, _ = await loaded_client(default_engine, reusable=False)
        releasing = asyncio.create_task(client.release(timeout_s=0.5))
        asked = decode_to_worker(await worker.recv())
        worker.close()  # as a worker's end closes when it exits (this stand-in then sleeps on: it is killed)
        return asked, await releasing, await process.process.wait()

    asked, handed_back, code = asyncio.run(go())
    assert asked == Shutdown() and handed_back is None and code < 0  # asked to exit (it did not: killed)
