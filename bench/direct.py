"""The same prompts driven straight into the hf backend in this process: no HTTP, no IPC, no worker.

The ratio of the served numbers to these is what the whole serving path costs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench.loadgen import Timing
from bench.prompts import messages
from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams
from orchestrator.text.prompt import PromptEncoder


async def run_direct(engine_dir: Path, levels: list[tuple[int, int]], max_tokens: int) -> list[tuple[int, list[Timing], float]]:
    """For each (concurrency, requests): the timings and wall time, on one backend started once."""
    from orchestrator.backends import hf

    manifest = load_manifest(engine_dir)
    prompts = PromptEncoder(engine_dir)
    backend = hf.create(
        BackendSettings(engine_dir=engine_dir, manifest=manifest, kv_cache_bytes=manifest.kv_cache.default_budget_bytes)
    )
    streams = RequestStreams(backend)
    await backend.start(streams)
    results = []
    try:
        for concurrency, requests in levels:
            results.append((concurrency, *await _level(streams, prompts, concurrency, requests, max_tokens)))
    finally:
        await backend.close()
    return results


async def _level(streams: RequestStreams, prompts: PromptEncoder, concurrency: int, requests: int, max_tokens: int):
    indices = iter(range(requests))
    timings: list[Timing] = []

    async def client(worker: int) -> None:
        for index in indices:
            prompt_ids = tuple(prompts.encode_chat(messages(index)))
            request = EngineRequest(
                id=f"direct-{concurrency}-{index}", prompt_ids=prompt_ids, max_new_tokens=max_tokens,
                sampling=SamplingParams(temperature=0.0),
            )
            timing = Timing(sent=time.perf_counter())
            async for delta in streams.stream(request):
                if delta.token_ids:
                    now = time.perf_counter()
                    timing.first_token = timing.first_token or now
                    timing.chunk_times.append(now)
                    timing.completion_tokens += len(delta.token_ids)
            timings.append(timing)

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return timings, time.perf_counter() - started
