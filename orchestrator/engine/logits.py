"""The generation logits pool of a TensorRT-LLM model with `generation_logits` on: its size and each request's draw.

With `ExecutorConfig(gather_generation_logits=True)`, every request that asks for its logits (Inferno asks for
`top_logprobs`) holds a pinned host buffer of `max_new_tokens x beam x vocab_padded` fp32 logits while it runs.
These buffers come and go with requests, so the memory ledger holds a pool for them while the model is loaded
(its `generation_logits_bytes` setting; default: one choice of the longest sequence), and admission lets a request
run only while its draw fits what the pool has left. `vocab_padded` is the engine's vocabulary (config.json's
`pretrained_config.vocab_size`) rounded up to a multiple of its world size, as TensorRT-LLM pads it.

The HTTP side refuses a request larger than the whole pool (`check_fits`, naming its max tokens field as the wire
spells it); the scheduler draws from the pool at admission and gives back at the request's end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.engine.manifest import EngineManifest
from orchestrator.errors import InvalidRequest

LOGIT_BYTES = 4  # fp32: what the engine's host buffer holds, whatever the model's dtype


@dataclass(frozen=True)
class LogitsPool:
    """The pool's size and what one generated token of one choice draws from it."""

    pool_bytes: int
    bytes_per_token: int  # vocab_padded x LOGIT_BYTES (beam width 1)

    def draw(self, max_new_tokens: int, choices: int) -> int:
        """Bytes a request of `choices` choices, each up to `max_new_tokens`, holds while it runs."""
        return max_new_tokens * choices * self.bytes_per_token

    def check_fits(self, max_new_tokens: int, choices: int, param: str, asked: bool = True) -> None:
        """Refuse (400 naming `param`, the request's max tokens field) a request that the whole pool cannot hold;
        `asked`: whether the request gave `param` (else `max_new_tokens` is what the context leaves)."""
        need = self.draw(max_new_tokens, choices)
        if need <= self.pool_bytes:
            return
        most = self.pool_bytes // (choices * self.bytes_per_token)
        per = f" for each of its {choices} choices" if choices > 1 else ""
        given = f"{param} is {max_new_tokens}" if asked else f"without {param}, up to {max_new_tokens} tokens"
        raise InvalidRequest(
            f"{given}: with top_logprobs this request needs {size(need)} of this model's generation logits pool "
            f"({max_new_tokens} tokens x {self.bytes_per_token} bytes{per}), more than the whole pool "
            f"({size(self.pool_bytes)}, its generation_logits_bytes setting); ask for at most {most} tokens, fewer "
            "choices, or no top_logprobs",
            param=param,
        )


def logits_pool(manifest: EngineManifest, vocab_size: int, pool_bytes: int | None) -> LogitsPool | None:
    """The model's pool as served: None unless it is a TensorRT-LLM engine with `generation_logits` on. Without
    `pool_bytes` (the model's setting), one choice of the longest sequence fits it."""
    if manifest.backend != "trtllm" or not manifest.generation_logits:
        return None
    world = manifest.parallel.world_size
    per_token = -(-vocab_size // world) * world * LOGIT_BYTES  # TensorRT-LLM pads the vocabulary to the world size
    return LogitsPool(pool_bytes if pool_bytes is not None else manifest.limits.max_seq_len * per_token, per_token)


def engine_vocab_size(folder: Path) -> int | None:
    """The engine's vocabulary, from its config.json (`pretrained_config.vocab_size`); None when it does not say."""
    try:
        return int(json.loads((folder / "config.json").read_text())["pretrained_config"]["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def size(n: int) -> str:
    """Bytes in words: GiB, MiB or KiB to two decimals, whichever keeps the number at least 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"
