"""How long one engine step takes (sim-calibration.md §1), and the parameters for other models and GPUs.

One step holds `n_dec` decoding sequences that together hold `KV` cached tokens, plus prefill chunks
(chunk i: `n_i` new prompt tokens on top of `p_i` tokens already cached):

    step_ms = a + b*n_dec + c*KV/1e6 + (sum n_i)/e + q * sum(n_i * (n_i + 2*p_i))

The FP8 and BF16 parameter sets were fitted on TensorRT-LLM's published H100 results for Llama-3.1-8B.
`derive` carries them over to another model shape, size, GPU or tensor-parallel size by first-order ratios
(weights read, KV read, GEMM work, attention work); for Llama-3.1-8B on an H100 SXM it returns the fit itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backends.sim.memory import ModelShape, Precision, kv_bytes_per_token, weights_bytes
from orchestrator.engine.gpus import REFERENCE_GPU, SimGpu


class StepCoefficients(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    a_ms: float = Field(ge=0)  # every step: weights read + kernel launches
    b_ms: float = Field(ge=0)  # per decoding sequence: per-row GEMM work and sampling
    c_ms_per_mtok: float = Field(ge=0)  # per million cached tokens the decoding sequences read
    e_tok_per_ms: float = Field(gt=0)  # linear prefill rate, prompt tokens per ms
    q_ms_per_tok2: float = Field(ge=0)  # causal attention of prefill chunks

    def step_ms(self, decode_rows: int, kv_tokens: int, chunks: Iterable[tuple[int, int]] = ()) -> float:
        """One step's duration in ms. `chunks`: (new prompt tokens, tokens already cached before them)."""
        new = attention = 0
        for n, p in chunks:
            new += n
            attention += n * (n + 2 * p)
        return (
            self.a_ms
            + self.b_ms * decode_rows
            + self.c_ms_per_mtok * kv_tokens / 1e6
            + new / self.e_tok_per_ms
            + self.q_ms_per_tok2 * attention
        )


# Fit [I] on trtllm-bench H100 results (RMS error 3.0%, worst 5.0%); BF16 from a 2024 engine.
CALIBRATED: dict[str, StepCoefficients] = {
    "fp8": StepCoefficients(a_ms=4.55, b_ms=0.0155, c_ms_per_mtok=20.0, e_tok_per_ms=76.4, q_ms_per_tok2=5.46e-7),
    "bf16": StepCoefficients(a_ms=7.0, b_ms=0.0378, c_ms_per_mtok=40.0, e_tok_per_ms=45.5, q_ms_per_tok2=1.09e-6),
}
REFERENCE_PARAMETERS = 8_030_261_248  # Llama-3.1-8B
REFERENCE_SHAPE = ModelShape(
    layers=32, hidden_size=4096, attention_heads=32, kv_heads=8, head_dim=128, vocab_size=128_256
)


def _launch_ms(precision: Precision) -> float:
    """The part of `a` that is not reading the weights: kernel launches and fixed work, per step."""
    weights_ms = weights_bytes(REFERENCE_PARAMETERS, REFERENCE_SHAPE, precision) / REFERENCE_GPU.bandwidth_bytes_s * 1e3
    return CALIBRATED[precision].a_ms - weights_ms


def derive(precision: Precision, shape: ModelShape, parameters: int, gpu: SimGpu, tp: int = 1) -> StepCoefficients:
    """The calibrated parameters carried over to this model on `tp` GPUs of this kind [I].

    a: launches scale with layers, the weights read with the weights per GPU over the bandwidth;
    b and e: GEMM work per token scales with parameters per GPU over compute;
    c: KV read per token scales with KV bytes per GPU over the bandwidth;
    q: attention scales with layers x query width per GPU over compute.
    Tensor parallelism's all-reduce cost is not modelled.
    """
    ref, ref_shape = CALIBRATED[precision], REFERENCE_SHAPE
    weights_per_gpu = weights_bytes(parameters, shape, precision) / tp
    params_ratio = parameters / tp / REFERENCE_PARAMETERS
    kv_ratio = kv_bytes_per_token(shape, precision) / tp / kv_bytes_per_token(ref_shape, precision)
    attention_ratio = (shape.layers * shape.attention_heads * shape.head_dim / tp) / (
        ref_shape.layers * ref_shape.attention_heads * ref_shape.head_dim
    )
    bandwidth_ratio = REFERENCE_GPU.bandwidth_bytes_s / gpu.bandwidth_bytes_s
    compute_ratio = REFERENCE_GPU.compute / gpu.compute
    return StepCoefficients(
        a_ms=_launch_ms(precision) * shape.layers / ref_shape.layers + weights_per_gpu / gpu.bandwidth_bytes_s * 1e3,
        b_ms=ref.b_ms * params_ratio * compute_ratio,
        c_ms_per_mtok=ref.c_ms_per_mtok * kv_ratio * bandwidth_ratio,
        e_tok_per_ms=ref.e_tok_per_ms / params_ratio / compute_ratio,
        q_ms_per_tok2=ref.q_ms_per_tok2 * attention_ratio * compute_ratio,
    )
