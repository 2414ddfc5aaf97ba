"""A synthetic 'model' for constrained-decoding tests: seeded random logits over the real vocabulary.

Grammar-agnostic biases stand in for a model's habits: whitespace-only tokens are unlikely and tokens with
a double quote likely, so strings and runs of whitespace end within a few dozen steps (any JSON grammar
allows unbounded whitespace, which pure noise would wander into for thousands of steps).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Tokenizer

from orchestrator.structured.grammar.matcher import GrammarCache, GuidedBatchMasker, GuidedState
from orchestrator.text.detokenizer import IncrementalDetokenizer


@lru_cache(maxsize=4)
def habits(folder: Path, width: int) -> torch.Tensor:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bias = torch.zeros(width)
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        bias[token_id] = (-4.0 if text.strip() == "" else 0.0) + (3.0 if '"' in text else 0.0)
    return bias


def greedy_decode(
    folder: Path, cache: GrammarCache, state: GuidedState, *, seed: int, rows: int = 3, max_steps: int = 3000
) -> tuple[str, list[int]]:
    """Decode with the constrained request in the middle row of a batch of `rows`; argmax of the masked
    logits, accepted into the state, until the grammar accepts an end token. Returns (text, token ids),
    the text detokenised by the worker's own detokeniser (special tokens skipped)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensor ops; extra threads only wait on a busy machine
    try:
        return _greedy_decode(folder, cache, state, seed, rows, max_steps)
    finally:
        torch.set_num_threads(threads)


def _greedy_decode(
    folder: Path, cache: GrammarCache, state: GuidedState, seed: int, rows: int, max_steps: int
) -> tuple[str, list[int]]:
    width = cache.vocabulary.size
    bias = habits(folder, width)
    generator = torch.Generator().manual_seed(seed)
    masker = GuidedBatchMasker(width, rows=1)
    row = rows // 2
    others = torch.randn(rows, width, generator=generator)  # unconstrained rows, which must stay as they are
    logits = torch.empty(rows, width)
    ids: list[int] = []
    for _ in range(max_steps):
        logits.copy_(others)
        torch.randn(width, generator=generator, out=logits[row]).add_(bias)
        masker.apply(logits, [(row, state)])
        assert torch.equal(logits[:row], others[:row]), "an unconstrained row was changed"
        assert torch.equal(logits[row + 1 :], others[row + 1 :]), "an unconstrained row was changed"
        token = int(logits[row].argmax())
        assert state.accept(token), f"the grammar refused the token its own mask allowed ({token})"
        ids.append(token)
        if state.is_terminated:
            break
    assert state.is_terminated, f"no end token within {max_steps} steps"
    assert ids[-1] in cache.vocabulary.stop_token_ids
    text = IncrementalDetokenizer(Tokenizer.from_file(str(folder / "tokenizer.json"))).push(ids)
    return text, ids
