"""What one llamacpp engine step computes: a pure decision over plain data.

Every sequence that has a token to decode gets its row first. Prompt tokens fill the rest of the batch in
admission order, chunked, with one limit: while any sequence is decoding, a step takes at most
`prefill_while_decoding` prompt tokens. On a CPU a step costs about the same per token whether the token is a
prompt's or an output's, so a 500-token prompt computed in one step would stall every decoding sequence for
the whole of it; in chunks, their next tokens keep coming while the prompt is computed.

How many threads a step runs on is learned as steps run (threads.py).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_WHILE_DECODING = 128  # prompt tokens per step while other sequences decode


@dataclass(frozen=True)
class StepPlan:
    decode: tuple[str, ...]  # sequences computing their one pending token
    prefill: tuple[tuple[str, int], ...]  # (sequence, prompt tokens computed now)

    @property
    def tokens(self) -> int:
        return len(self.decode) + sum(count for _, count in self.prefill)


def plan_step(
    pending: list[tuple[str, int]], n_batch: int, prefill_while_decoding: int = PREFILL_WHILE_DECODING
) -> StepPlan:
    """`pending`: (sequence, tokens it has left to compute), in admission order. A sequence with one token
    left decodes it (its output's next token, or a prompt whose cached prefix covers all but its last token)."""
    decode = tuple(name for name, left in pending if left == 1)[:n_batch]
    budget = n_batch - len(decode)
    if decode:
        budget = min(budget, prefill_while_decoding)
    prefill = []
    for name, left in pending:
        if budget <= 0:
            break
        if left > 1:
            take = min(left, budget)
            prefill.append((name, take))
            budget -= take
    return StepPlan(decode, tuple(prefill))
