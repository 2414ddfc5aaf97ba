"""What sampling costs per engine step: the llamacpp backend's numpy sampling against llama.cpp's own sampler
chains (one per sequence), on the same logits of one real batched decode.

    python -m bench.llamacpp_sampling [--engine engines/smollm2-135m] [--rows 16] [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from orchestrator.backends.llamacpp.api import Context, ContextShape, Model, bindings
from orchestrator.backends.llamacpp.sampling import SequenceSampler, sample
from orchestrator.engine.request import EngineRequest, SamplingParams

SETTINGS = {"greedy": (0.0, 1.0), "temperature 0.2, top_p 0.9 (SmolLM2's default)": (0.2, 0.9),
            "temperature 1.0, top_p 0.95": (1.0, 0.95), "temperature 1.0": (1.0, 1.0)}
PROMPT = (1, 9690, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198)  # a chat turn, SmolLM2


class SamplerChain:
    """llama.cpp's own per-sequence sampler chain (temperature, top-p, a seeded draw; or greedy), sampling from
    a row of the last decode's logits. The backend samples in numpy instead; this is what it is compared with."""

    def __init__(self, temperature: float, top_p: float, seed: int):
        lib = bindings()
        self._lib = lib
        self.handle = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if temperature == 0.0:
            lib.llama_sampler_chain_add(self.handle, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(self.handle, lib.llama_sampler_init_temp(temperature))
            lib.llama_sampler_chain_add(self.handle, lib.llama_sampler_init_top_p(top_p, 1))
            lib.llama_sampler_chain_add(self.handle, lib.llama_sampler_init_dist(seed))

    def sample(self, context: Context, batch_index: int) -> int:
        """The token for the batch row `batch_index` (its place in the batch, not among the logit rows)."""
        return self._lib.llama_sampler_sample(self.handle, context.handle, batch_index)

    def free(self) -> None:
        self._lib.llama_sampler_free(self.handle)


def decode_rows(context: Context, rows: int) -> None:
    """One decode of `rows` sequences holding the same chat prompt, each asking for its next token's logits."""
    batch, n = context.batch, len(PROMPT)
    for row in range(rows):
        at = slice(row * n, (row + 1) * n)
        batch.token[at], batch.pos[at], batch.seq[at] = PROMPT, np.arange(n), row
        batch.logits[at] = 0
        batch.logits[(row + 1) * n - 1] = 1
    assert context.decode(rows * n) == 0


def per_step_us(run, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        run()
    return round((time.perf_counter() - started) / repeat * 1e6, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llamacpp_sampling")
    parser.add_argument("--engine", type=Path, default=Path("engines/smollm2-135m"))
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    model = Model(args.engine / "model.gguf")
    context = Context(model, ContextShape(n_ctx=1024, n_batch=512, n_ubatch=512, n_seq_max=args.rows, n_threads=1))
    decode_rows(context, args.rows)
    logits = context.logits(args.rows).copy()
    results = {}
    for name, (temperature, top_p) in SETTINGS.items():
        params = SamplingParams(temperature=temperature, top_p=top_p, seed=1)
        samplers = [SequenceSampler(EngineRequest(str(i), (1,), 64, params), np.array([2]), context.n_vocab)
                    for i in range(args.rows)]
        chains = [SamplerChain(temperature, top_p, seed=i) for i in range(args.rows)]
        results[name] = {
            "numpy_us_per_step": per_step_us(lambda s=samplers: sample(logits.copy(), s), args.repeat),
            "llama_sampler_us_per_step": per_step_us(
                lambda c=chains: [chain.sample(context, (i + 1) * len(PROMPT) - 1) for i, chain in enumerate(c)],
                args.repeat),
        }
        for chain in chains:
            chain.free()
    report = {"rows": args.rows, "vocab": context.n_vocab, "results": results}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
