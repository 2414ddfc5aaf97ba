"""What one llamacpp engine step computes: a pure decision over plain data.

Every sequence that has a token to decode gets its row first. Prompt tokens fill the rest of the batch in
admission order, chunked, with two limits while any sequence is decoding: each prompt takes at most
`prefill_while_decoding` tokens a step, and all prompts together at most one pass's worth (`n_ubatch`). On a CPU
a step costs about the same per token whether the token is a prompt's or an output's, so a 500-token prompt
computed in one step would stall every decoding sequence for the whole of it; in chunks, their next tokens keep
coming while the prompt is computed. Short prompts that arrive together are computed together (each within
its chunk): with a KV stream per sequence, llama.cpp computes every prompt of a step that is not in step with the
others in a pass over the weights of its own, so spreading a burst of prompts over many steps costs passes, and
the sequences then finish at different steps.

How many threads a step runs on is learned as steps run (threads.py).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_WHILE_DECODING = 128  # prompt tokens per prompt and step while other sequences decode
# A step takes up to this many passes' worth of tokens (llama.cpp's n_batch over its n_ubatch, the manifest's
# max_num_tokens), as llama-server's defaults do (2,048 over 512): prompts that arrive together while nothing
# decodes are computed in one step, so they decode in step with each other from then on.
STEP_UBATCHES = 4


@dataclass(frozen=True)
class StepPlan:
    decode: tuple[str, ...]  # sequences computing their one pending token
    prefill: tuple[tuple[str, int], ...]  # (sequence, prompt tokens computed now)

    @property
    def tokens(self) -> int:
        return len(self.decode) + sum(count for _, count in self.prefill)


def plan_step(pending: list[tuple[str, int]], n_batch: int, prefill_while_decoding: int = PREFILL_WHILE_DECODING,
              n_ubatch: int | None = None) -> StepPlan:
    """`pending`: (sequence, tokens it has left to compute), in admission order. A sequence with one token
    left decodes it (its output's next token, or a prompt whose cached prefix covers all but its last token).
    `n_ubatch` (default `n_batch`): the prompt tokens a step takes in all while anything decodes."""
    decode = tuple(name for name, left in pending if left == 1)[:n_batch]
    budget = n_batch - len(decode)
    chunk = budget
    if decode:
        budget = min(budget, n_ubatch or n_batch)
        chunk = prefill_while_decoding
    prefill = []
    for name, left in pending:
        if budget <= 0:
            break
        if left > 1:
            take = min(left, budget, chunk)
            prefill.append((name, take))
            budget -= take
    return StepPlan(decode, tuple(prefill))
