"""The memory a simulated model takes on its GPU(s): weights, KV cache and runtime overhead (sim-calibration.md §2).

Sizes are totals over the engine's GPUs (a TP 4 engine's weights are the whole model's, spread over four).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["fp8", "bf16"]  # weights and KV cache together, as TensorRT-LLM's FP8 and 16-bit builds
KV_BYTES = {"fp8": 1, "bf16": 2}
CUDA_CONTEXT_BYTES = 512 * 2**20  # per GPU
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN = 64  # 2 GiB for Llama-3.1-8B at max_num_tokens 8192 [I]
KV_FRACTION = 0.9  # of the GPU's memory, as TensorRT-LLM's free_gpu_memory_fraction


class ModelShape(BaseModel):
    """What the arithmetic needs of a decoder-only transformer (a recipe's [shape], or config.json's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    attention_heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    tied_embeddings: bool = False  # lm_head shares the embedding's weights


def kv_bytes_per_token(shape: ModelShape, precision: Precision) -> int:
    """K and V of every layer for one token: 2 · layers · kv_heads · head_dim · dtype bytes."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * KV_BYTES[precision]


def weights_bytes(parameters: int, shape: ModelShape, precision: Precision) -> int:
    """BF16: 2 bytes per parameter. FP8 (NVIDIA ModelOpt): linear layers in FP8, the embedding and lm_head in BF16."""
    if precision == "bf16":
        return 2 * parameters
    embeddings = shape.vocab_size * shape.hidden_size * (1 if shape.tied_embeddings else 2)
    return parameters + embeddings


def runtime_overhead_bytes(shape: ModelShape, max_num_tokens: int, gpus: int = 1) -> int:
    """CUDA context per GPU plus activations reserved for max_num_tokens tokens in one step [I]."""
    return gpus * CUDA_CONTEXT_BYTES + max_num_tokens * shape.hidden_size * ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN


def kv_token_capacity(budget_bytes: int, bytes_per_token: int, tokens_per_block: int) -> int:
    """Tokens a KV budget holds, rounded down to whole blocks."""
    return budget_bytes // bytes_per_token // tokens_per_block * tokens_per_block


def default_kv_budget(device_bytes: int, weights: int, overhead: int) -> int:
    """The KV budget of a model alone on its GPU(s): what is left of 90% of the memory after weights and
    overhead. Close to TensorRT-LLM's default (90% of what is free after weights and activations), and small
    enough that the model alone fits the memory ledger's default 10% reserve."""
    return max(0, int(KV_FRACTION * device_bytes) - weights - overhead)


def device_bytes(weights: int, kv_tokens: int, bytes_per_token: int, overhead: int) -> int:
    """What a loaded model holds on its GPU(s)."""
    return weights + kv_tokens * bytes_per_token + overhead
