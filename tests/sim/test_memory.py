"""The memory arithmetic of sim-calibration.md §2."""

from __future__ import annotations

import pytest

from orchestrator.backends.sim.memory import (
    default_kv_budget,
    device_bytes,
    kv_bytes_per_token,
    kv_token_capacity,
    runtime_overhead_bytes,
    weights_bytes,
)
from orchestrator.backends.sim.step_time import REFERENCE_PARAMETERS, REFERENCE_SHAPE
from orchestrator.engine.gpus import GPUS


def test_kv_bytes_per_token_of_llama_3_1_8b():
    assert kv_bytes_per_token(REFERENCE_SHAPE, "bf16") == 131_072
    assert kv_bytes_per_token(REFERENCE_SHAPE, "fp8") == 65_536


def test_weights_bytes_bf16_and_modelopt_fp8():
    assert weights_bytes(REFERENCE_PARAMETERS, REFERENCE_SHAPE, "bf16") == pytest.approx(16.06e9, abs=0.01e9)
    assert weights_bytes(REFERENCE_PARAMETERS, REFERENCE_SHAPE, "fp8") == pytest.approx(9.08e9, abs=0.01e9)
    tied = REFERENCE_SHAPE.model_copy(update={"tied_embeddings": True})
    untied_extra = weights_bytes(REFERENCE_PARAMETERS, REFERENCE_SHAPE, "fp8") - REFERENCE_PARAMETERS
    assert weights_bytes(REFERENCE_PARAMETERS, tied, "fp8") - REFERENCE_PARAMETERS == untied_extra // 2


def test_kv_capacity_is_rounded_down_to_whole_blocks():
    per_block = 65_536 * 32
    assert kv_token_capacity(10 * per_block, 65_536, 32) == 320
    assert kv_token_capacity(10 * per_block + per_block - 1, 65_536, 32) == 320
    assert kv_token_capacity(per_block - 1, 65_536, 32) == 0


def test_an_h100_alone_holds_about_a_million_fp8_tokens():
    weights = weights_bytes(REFERENCE_PARAMETERS, REFERENCE_SHAPE, "fp8")
    overhead = runtime_overhead_bytes(REFERENCE_SHAPE, 8192)
    assert overhead == 512 * 2**20 + 2 * 2**30  # CUDA context + activations for 8192 tokens
    budget = default_kv_budget(GPUS["h100-sxm"].memory_bytes, weights, overhead)
    tokens = kv_token_capacity(budget, 65_536, 32)
    assert 0.95e6 < tokens < 1.05e6  # "about 1.0M tokens (≈ 487 sequences of 2k)"
    assert tokens // 2048 == pytest.approx(487, abs=5)
    held = device_bytes(weights, tokens, 65_536, overhead)
    assert held <= 0.9 * GPUS["h100-sxm"].memory_bytes  # fits the memory ledger's default 10% reserve


def test_a_model_too_large_for_its_gpu_has_no_kv_budget():
    assert default_kv_budget(80 * 10**9, 141 * 10**9, 3 * 10**9) == 0
