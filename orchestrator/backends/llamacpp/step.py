"""What one llamacpp engine step computes: a pure decision over plain data.

Every sequence that has a token to decode gets its row first. Prompt tokens fill the rest of the batch in
admission order, chunked, with one limit: while any sequence is decoding, a step takes at most
`prefill_while_decoding` prompt tokens. On a CPU a step costs about the same per token whether the token is a
prompt's or an output's, so a 500-token prompt computed in one step would stall every decoding sequence for
the whole of it; in chunks, their next tokens keep coming while the prompt is computed.

How many threads a step runs on is decided here too (`StepThreads`): llama.cpp's threads wait for each other at
every operation by spinning, so a short step (a few sequences decoding) loses more to that wait, and to any other
process taking one of their cores, than it gains; a long one (many rows, or a prompt) gains.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_WHILE_DECODING = 128  # prompt tokens per step while other sequences decode
MANY_THREADS_FROM = 8  # tokens in a step from which it runs on every core (docs/llamacpp.md, "Threads")


@dataclass(frozen=True)
class StepThreads:
    """The threads a step runs on: `few` for a step of fewer than `from_tokens` tokens, `many` from there."""

    few: int
    many: int
    from_tokens: int = MANY_THREADS_FROM

    @classmethod
    def fixed(cls, threads: int) -> StepThreads:
        return cls(threads, threads)

    @classmethod
    def default(cls, cores: int) -> StepThreads:
        """Short steps leave one core to the serving path (the HTTP process, this worker's event loop); long
        steps take them all."""
        return cls(max(1, cores - 1), max(1, cores))

    def for_step(self, tokens: int) -> int:
        return self.many if tokens >= self.from_tokens else self.few

    def describe(self) -> str:
        if self.few == self.many:
            return f"{self.few} threads"
        return f"{self.few} threads for steps under {self.from_tokens} tokens, {self.many} from there"


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
