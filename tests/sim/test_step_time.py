"""The step-time model against sim-calibration.md §1's tables, and its carrying over to other models and GPUs."""

from __future__ import annotations

import pytest

from orchestrator.backends.sim.memory import ModelShape
from orchestrator.backends.sim.step_time import CALIBRATED, REFERENCE_PARAMETERS, REFERENCE_SHAPE, derive
from orchestrator.engine.gpus import GPUS

# Predicted decode step (ms) for B sequences of ctx tokens each: FP8 1k, 2k, 4k, then BF16 1k, 2k, 4k.
DECODE = {
    1: (4.6, 4.6, 4.6, 7.1, 7.1, 7.2),
    32: (5.6, 6.2, 7.4, 9.4, 10.6, 12.9),
    128: (8.9, 11.2, 15.9, 16.5, 21.2, 30.7),
    256: (13.2, 17.9, 27.3, 26.1, 35.5, 54.3),
}
# Prefill alone (ms), FP8 and BF16.
PREFILL = {128: (6.2, 9.8), 2048: (33.7, 56.6), 8192: (148.0, 260.0)}
# The document expects ±10% against TensorRT-LLM. Its decode table sits 0-8% below the formula with the
# stated c (it reads as computed with c about 0.92 of it); prefill matches to the printed digit.
DECODE_TOLERANCE = 0.10
PREFILL_TOLERANCE = 0.01


@pytest.mark.parametrize("batch", sorted(DECODE))
@pytest.mark.parametrize("column", range(6))
def test_decode_steps_match_the_calibration_table(batch, column):
    precision = "fp8" if column < 3 else "bf16"
    context = 1024 * (1, 2, 4)[column % 3]
    predicted = CALIBRATED[precision].step_ms(batch, batch * context)
    assert predicted == pytest.approx(DECODE[batch][column], rel=DECODE_TOLERANCE)


@pytest.mark.parametrize("tokens", sorted(PREFILL))
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_prefill_times_match_the_calibration_table(tokens, precision):
    predicted = CALIBRATED[precision].step_ms(0, 0, [(tokens, 0)])
    expected = PREFILL[tokens][0 if precision == "fp8" else 1]
    assert predicted == pytest.approx(expected, rel=PREFILL_TOLERANCE)


def test_cached_prefix_tokens_cost_only_attention():
    fp8 = CALIBRATED["fp8"]
    cold = fp8.step_ms(0, 0, [(2048, 0)])
    warm = fp8.step_ms(0, 0, [(64, 1984)])  # the same prompt, 1984 tokens from the prefix cache
    assert warm == pytest.approx(fp8.a_ms + 64 / fp8.e_tok_per_ms + fp8.q_ms_per_tok2 * 64 * (64 + 2 * 1984))
    assert warm < cold / 4


def test_chunks_and_decode_rows_add_up():
    fp8 = CALIBRATED["fp8"]
    alone = [fp8.step_ms(0, 0, [(512, 0)]), fp8.step_ms(0, 0, [(256, 512)]), fp8.step_ms(16, 16_000)]
    together = fp8.step_ms(16, 16_000, [(512, 0), (256, 512)])
    assert together == pytest.approx(sum(alone) - 2 * fp8.a_ms)


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_derive_gives_the_fit_itself_for_llama_3_1_8b_on_an_h100(precision):
    derived = derive(precision, REFERENCE_SHAPE, REFERENCE_PARAMETERS, GPUS["h100-sxm"])
    for name, value in CALIBRATED[precision].model_dump().items():
        assert getattr(derived, name) == pytest.approx(value, rel=1e-9), name


def test_derive_carries_over_by_bandwidth_size_and_parallelism():
    h100, h200 = GPUS["h100-sxm"], GPUS["h200"]
    base = derive("fp8", REFERENCE_SHAPE, REFERENCE_PARAMETERS, h100)
    faster_memory = derive("fp8", REFERENCE_SHAPE, REFERENCE_PARAMETERS, h200)
    assert faster_memory.a_ms < base.a_ms and faster_memory.c_ms_per_mtok < base.c_ms_per_mtok
    assert faster_memory.e_tok_per_ms == pytest.approx(base.e_tok_per_ms)  # the same chip: the same compute
    two_gpus = derive("fp8", REFERENCE_SHAPE, REFERENCE_PARAMETERS, h100, tp=2)
    assert two_gpus.b_ms == pytest.approx(base.b_ms / 2)
    assert two_gpus.e_tok_per_ms == pytest.approx(base.e_tok_per_ms * 2)
    assert two_gpus.c_ms_per_mtok == pytest.approx(base.c_ms_per_mtok / 2)
    seventy_b = ModelShape(layers=80, hidden_size=8192, attention_heads=64, kv_heads=8, head_dim=128, vocab_size=128_256)
    big = derive("fp8", seventy_b, 70_553_706_496, h100, tp=4)
    assert big.a_ms > base.a_ms and big.c_ms_per_mtok == pytest.approx(base.c_ms_per_mtok * 80 / 32 / 4)
