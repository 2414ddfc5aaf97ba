"""The engine as a whole, in simulated time: admission, chunked prefill and the step-time model together
reproduce sim-calibration.md's saturated throughput (GUARANTEED_NO_EVICT, concurrency = min(2048, KV capacity
/ (ISL + OSL))), which the step-time fit alone does not contain."""

from __future__ import annotations

import pytest

from orchestrator.backends.sim.engine import SimEngine
from orchestrator.backends.sim.step_time import CALIBRATED
from orchestrator.engine.manifest import Limits
from orchestrator.engine.request import EngineRequest, SamplingParams

H100_FP8_KV_TOKENS = 994_912  # llama3.1-8b-sim's default KV capacity (test_memory)


def closed_loop_tok_s(isl: int, osl: int, concurrency: int, requests: int) -> float:
    """Output tokens per simulated second once every client has had one answer, each client sending its
    next request as its last one ends; prompts differ, so nothing comes from the prefix cache."""
    limits = Limits(max_batch_size=2048, max_input_len=isl, max_seq_len=isl + osl, max_num_tokens=8192)
    engine = SimEngine(CALIBRATED["fp8"], limits, 32, H100_FP8_KV_TOKENS // 32, tuple(range(1000, 1500)), 100)
    sent = 0

    def send() -> None:
        nonlocal sent
        prompt = (sent + 1, *range(2, isl + 1))
        engine.add(EngineRequest(f"r{sent}", prompt, osl, SamplingParams(seed=sent), ignore_eos=True))
        sent += 1

    for _ in range(concurrency):
        send()
    elapsed_ms = produced = done = 0
    warm = None
    while done < requests:
        result = engine.step()
        elapsed_ms += result.step_ms
        for delta in result.deltas:
            produced += len(delta.token_ids)
            if delta.finish is not None:
                done += 1
                send()
        if warm is None and done >= concurrency:
            warm = (elapsed_ms, produced)
    return (produced - warm[1]) / (elapsed_ms - warm[0]) * 1e3


def test_128_in_128_out_reaches_the_calibrated_fp8_throughput():
    concurrency = min(2048, H100_FP8_KV_TOKENS // (128 + 128))
    assert closed_loop_tok_s(128, 128, concurrency, 3 * concurrency) == pytest.approx(29_200, rel=0.10)
