"""The sim backend in-process, through the backend protocol: a real engine folder, its real tokenizer, the
engine thread, and `RequestStreams` as the worker stands in for the worker (orchestrator.backends.protocol)."""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from orchestrator.backends import create_backend, features_of
from orchestrator.backends.options import SimOptions
from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.backends.sim.backend import THREAD_NAME
from orchestrator.backends.sim.corpus import CORPUS
from orchestrator.backends.sim.memory import device_bytes
from orchestrator.backends.sim.spec import load_sim_spec
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams, TokenDelta
from orchestrator.errors import ModelUnavailable, UnsupportedParameter


def in_loop(test):
    """Run an async test body in a fresh event loop (the worker's loop stands in for it)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def settings(folder: Path, kv_cache_bytes: int | None = None) -> BackendSettings:
    manifest = load_manifest(folder)
    return BackendSettings(folder, manifest, kv_cache_bytes or manifest.kv_cache.default_budget_bytes)


def os_thread_names() -> list[str]:
    return [path.read_text().strip() for path in Path("/proc/self/task").glob("*/comm")]


class Recording:
    """An EngineOutputs that keeps every step's deltas, and wakes a waiter when a request has finished."""

    def __init__(self):
        self.steps: list[list[TokenDelta]] = []
        self.started: dict[str, asyncio.Event] = {}
        self.finished: dict[str, asyncio.Event] = {}

    def step(self, deltas: list[TokenDelta]) -> None:
        self.steps.append(list(deltas))
        for delta in deltas:
            self.started.setdefault(delta.request_id, asyncio.Event()).set()
            if delta.finish is not None:
                self.finished.setdefault(delta.request_id, asyncio.Event()).set()

    def dead(self, reason: str) -> None:
        raise AssertionError(f"the engine died: {reason}")

    async def wait(self, request_id: str) -> None:
        await self.finished.setdefault(request_id, asyncio.Event()).wait()


def greedy(rid: str, prompt: tuple[int, ...], max_new: int, **fields) -> EngineRequest:
    return EngineRequest(rid, prompt, max_new, SamplingParams(temperature=0.0), ignore_eos=True, **fields)


@in_loop
async def test_loads_streams_real_text_and_stops(fast_engine_dir):
    backend = create_backend(settings(fast_engine_dir))
    streams = RequestStreams(backend)
    report = await backend.start(streams)
    try:
        manifest, spec = load_manifest(fast_engine_dir), load_sim_spec(fast_engine_dir)
        kv = manifest.kv_cache
        stats = backend.stats()
        assert report.device == "sim:h100-sxm" and stats.tokens_per_block == kv.tokens_per_block
        tokens = stats.kv_blocks_total * kv.tokens_per_block
        assert report.device_bytes == device_bytes(manifest.weights_bytes, tokens, kv.bytes_per_token, spec.runtime_overhead_bytes)
        assert THREAD_NAME in [t.name for t in threading.enumerate()] and THREAD_NAME in os_thread_names()
        deltas = await streams.run(greedy("g", (1, 2, 3, 4), 24))
        assert [d.finish for d in deltas] == [None] * 23 + [FinishReason.LENGTH]
        assert [d.cached_tokens for d in deltas] == [0] + [None] * 23
        text = Tokenizer.from_file(str(fast_engine_dir / "tokenizer.json")).decode([t for d in deltas for t in d.token_ids])
        assert CORPUS.startswith(text) and len(text) > 60  # greedy: the corpus from its start, as real text
        assert backend.stats().iterations == 24
    finally:
        await backend.close()
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]


@in_loop
async def test_concurrent_requests_share_steps_and_keep_their_own_tokens(fast_engine_dir):
    backend = create_backend(settings(fast_engine_dir))
    outputs = Recording()
    await backend.start(outputs)
    try:
        prompt = tuple(range(5, 105))
        requests = [
            EngineRequest(f"r{i}", prompt, 20, SamplingParams(seed=i % 4), ignore_eos=True) for i in range(8)
        ]
        for request in requests:
            backend.submit(request)
        await asyncio.gather(*(outputs.wait(r.id) for r in requests))
        by_request: dict[str, list[int]] = {}
        for step in outputs.steps:
            assert len({d.request_id for d in step}) == len(step)  # one delta per request per step
            for delta in step:
                by_request.setdefault(delta.request_id, []).extend(delta.token_ids)
        assert all(len(tokens) == 20 for tokens in by_request.values())
        assert by_request["r0"] == by_request["r4"] and by_request["r0"] != by_request["r1"]  # per seed
        assert max(len(step) for step in outputs.steps) == 8  # all eight decode in the same steps
        stats = backend.stats()
        assert (stats.running, stats.waiting, stats.kv_blocks_used, stats.kv_blocks_reused) == (0, 0, 0, 0)
        backend.submit(EngineRequest("again", prompt, 2, ignore_eos=True))  # the prompt's blocks are cached now
        await outputs.wait("again")
        first = next(d for step in outputs.steps for d in step if d.request_id == "again")
        assert first.cached_tokens == 96 and backend.stats().kv_blocks_reused == 3  # 3 full blocks of 32
    finally:
        await backend.close()


@in_loop
async def test_cancel_ends_a_request_within_a_step_with_a_final_cancelled_delta(fast_engine_dir):
    backend = create_backend(settings(fast_engine_dir))
    outputs = Recording()
    await backend.start(outputs)
    try:
        backend.submit(greedy("long", (1, 2, 3), 30_000))
        backend.submit(greedy("queued", (1, 2, 3), 10))
        backend.cancel("long")  # in the same step as its submit: it never generates
        await outputs.wait("long")
        finals = [d for step in outputs.steps for d in step if d.request_id == "long"]
        assert [(d.finish, d.token_ids) for d in finals] == [(FinishReason.CANCELLED, [])]
        backend.submit(greedy("running", (1, 2, 3), 30_000))
        await outputs.started.setdefault("running", asyncio.Event()).wait()
        backend.cancel("running")
        await outputs.wait("running")
        last = [d for step in outputs.steps for d in step if d.request_id == "running"][-1]
        assert last.finish is FinishReason.CANCELLED and last.token_ids == []
        await outputs.wait("queued")
        assert backend.stats().running == 0 and backend.stats().kv_blocks_used == 0
    finally:
        await backend.close()


@in_loop
async def test_submit_refuses_what_it_cannot_honour(fast_engine_dir):
    backend = create_backend(settings(fast_engine_dir))
    await backend.start(Recording())
    try:
        with pytest.raises(UnsupportedParameter, match="frequency_penalty is not supported by the sim backend"):
            backend.submit(EngineRequest("p", (1, 2), 4, SamplingParams(frequency_penalty=0.5)))
        assert backend.stats().waiting == 0
    finally:
        await backend.close()
    assert features_of(load_manifest(fast_engine_dir)).logprobs
    assert not features_of(load_manifest(fast_engine_dir)).penalties


@in_loop
async def test_a_small_byte_budget_gives_a_small_cache_and_the_capacity_override_wins(fast_engine_dir):
    manifest = load_manifest(fast_engine_dir)
    per_block = manifest.kv_cache.bytes_per_token * manifest.kv_cache.tokens_per_block
    backend = create_backend(settings(fast_engine_dir, kv_cache_bytes=10 * per_block + 1))
    await backend.start(Recording())
    stats = backend.stats()
    await backend.close()
    assert stats.kv_blocks_total == 10
    with pytest.raises(ValueError, match="holds no whole block"):
        create_backend(settings(fast_engine_dir, kv_cache_bytes=per_block - 1))


def test_only_the_capacity_policy_it_simulates_is_accepted(fast_engine_dir):
    manifest = load_manifest(fast_engine_dir)
    asked = BackendSettings(fast_engine_dir, manifest, 10**9, SimOptions(capacity_policy="max_utilization"))
    with pytest.raises(ModelUnavailable, match="guaranteed_no_evict capacity policy only"):
        create_backend(asked)


def test_the_host_tier_is_prompt_cache_bytes_in_blocks_each_copied_back_over_pcie(sim_engine_dir):
    manifest = load_manifest(sim_engine_dir)
    plain = settings(sim_engine_dir)
    tiered = BackendSettings(sim_engine_dir, manifest, plain.kv_cache_bytes, SimOptions(prompt_cache_bytes=2**30))
    blocks, onboard_ms = create_backend(tiered).host_tier()
    kv = manifest.kv_cache
    block_bytes = kv.bytes_per_token * kv.tokens_per_block  # 2 MiB: Llama-3.1-8B in FP8, 32 tokens
    assert blocks == 2**30 // block_bytes == 512
    assert onboard_ms == pytest.approx(block_bytes / 55e9 * 1e3)  # about 38 µs at PCIe Gen5's 55 GB/s
    assert create_backend(plain).host_tier()[0] == 0  # none unless asked for
