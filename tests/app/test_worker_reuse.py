"""An unloaded model's worker process is released and serves the next load (supervisor/pool.py,
supervisor/client.py, worker/main.py), with real worker processes and the real llama.cpp and transformers
engines: the memory really goes back, the spare is that very process, and what it serves next equals what a
fresh load served in the same run."""

from __future__ import annotations

import asyncio
import functools

import psutil
import pytest

from orchestrator.backends.options import options_model
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams
from orchestrator.ipc.messages import LoadSpec, TextDelta
from orchestrator.supervisor.pool import WorkerPool
from orchestrator.supervisor.process import spawn_worker

KV_BYTES = 32 * 2**20
PROMPT = (1, 4093, 198, 6004, 2)


async def answer(worker, request_id: str) -> tuple[str, int]:
    """A greedy request's whole text and token count."""
    done = asyncio.get_running_loop().create_future()
    deltas: list[TextDelta] = []

    def sink(row: list) -> None:
        deltas.append(TextDelta.from_wire(row))
        if deltas[-1].finish is not None:
            done.set_result(None)

    request = EngineRequest(request_id, PROMPT, max_new_tokens=8, sampling=SamplingParams(temperature=0.0))
    worker.submit(request, sink)
    await asyncio.wait_for(done, 120)
    return "".join(d.text for d in deltas), sum(d.num_tokens for d in deltas)


async def load_release_load(engine) -> dict:
    backend = load_manifest(engine).backend
    spec = LoadSpec(str(engine), KV_BYTES, options_model(backend)())
    pool = WorkerPool(functools.partial(spawn_worker, (backend,), "warning"), keep_spare=True, refill="when-idle")
    exits: list[str] = []
    try:
        first = await pool.take("first", exits.append)
        ready = await first.start(spec, 300)
        fresh = await answer(first, "fresh")
        loaded_rss = psutil.Process(ready.pid).memory_info().rss
        kept = await pool.retire(first, 60, reuse=True)
        unloaded_rss = psutil.Process(ready.pid).memory_info().rss
        spare = pool.spare_state
        second = await pool.take("second", exits.append)
        again = await second.start(spec, 300)
        reused = await answer(second, "reused")
        await second.stop(30)
    finally:
        await pool.close()
    return {"kept": kept, "spare": spare, "same_pid": again.pid == ready.pid, "fresh": fresh, "reused": reused,
            "freed": loaded_rss - unloaded_rss, "exits": exits}


@pytest.mark.parametrize("which", ["gguf_engine", "default_engine"])
def test_an_unloaded_worker_gives_its_memory_back_and_serves_the_next_load_as_a_fresh_one(which, request):
    engine = request.getfixturevalue(which)
    weights = sum(f.stat().st_size for f in engine.iterdir() if f.suffix in (".gguf", ".safetensors"))
    seen = asyncio.run(load_release_load(engine))
    assert (seen["kept"], seen["spare"], seen["same_pid"]) == (True, "warm", True)
    assert seen["reused"] == seen["fresh"] and seen["fresh"][1] > 0
    assert seen["freed"] > weights // 2, f"only {seen['freed'] / 2**20:.0f} MiB of {weights / 2**20:.0f} went back"
    assert seen["exits"] == ["first", "second"]
