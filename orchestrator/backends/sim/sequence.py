"""One simulated sequence: where its prompt stands in the KV cache, and the tokens it generates.

Tokens are read from the corpus (corpus.py) starting at an offset derived from the request's seed (0 for
greedy requests), so the same seed and prompt always give the same tokens. A request that may end on an end
token does so after a "natural" length drawn from its seed and prompt: between half and one and a half times
the engine's `natural_length`, never before `min_tokens`. Stop tokens met in the corpus end the sequence like
an end token (skipped before `min_tokens`, as an engine masks them).

Log probabilities are synthetic: deterministic values from the token, its position and the seed, with the
alternatives' probabilities summing to at most what the chosen token leaves. They say nothing about the text.
"""

from __future__ import annotations

import math

from orchestrator.engine.request import EngineRequest, FinishReason

MASK = 2**64 - 1


def mix64(value: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an integer."""
    z = (value + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def unit(value: int) -> float:
    """A number in [0, 1) hashed from an integer."""
    return mix64(value & MASK) / 2.0**64


def natural_end(request: EngineRequest, natural_length: int) -> int | None:
    """After how many tokens the sequence ends on an end token; None when end tokens are ignored."""
    if request.ignore_eos:
        return None
    key = hash(request.prompt_ids) if request.sampling.greedy else request.sampling.seed ^ hash(request.prompt_ids)
    drawn = max(1, round(natural_length * (0.5 + unit(key))))
    return max(drawn, request.min_tokens)


class Sequence:
    __slots__ = (
        "admitted", "blocks", "cached", "capacity", "computed", "cursor", "done", "end_at", "extras",
        "generated", "hashes", "id", "kept", "length", "max_new", "min_tokens", "onboarded", "order", "priority",
        "prompt", "reported_cached", "request", "reserve_left", "salt", "stops",
    )

    def __init__(self, request: EngineRequest, order: int, corpus_len: int, max_seq_len: int, natural_length: int):
        self.request = request
        self.id = request.id
        self.prompt = request.prompt_ids
        self.priority = request.priority
        self.order = order  # arrival order: first come first served within a priority
        self.max_new = min(request.max_new_tokens, max_seq_len - len(self.prompt))
        self.min_tokens = request.min_tokens
        self.stops = frozenset(request.stop_token_ids)
        self.cursor = 0 if request.sampling.greedy else mix64(request.sampling.seed & MASK) % corpus_len
        self.end_at = natural_end(request, natural_length)
        self.salt = request.sampling.seed & MASK
        self.computed = 0  # prompt tokens in the KV cache: reused from the prefix cache or prefilled
        self.cached = 0  # of those, reused from the prefix cache
        self.generated = 0
        self.length = 0  # tokens it holds in the KV cache: computed + generated
        self.blocks: list[int] = []
        self.capacity = 0  # tokens its blocks hold
        self.hashes: list[int] = []  # content hashes of the prompt's full blocks
        self.reserve_left = 0  # blocks reserved at admission and not yet allocated
        self.onboarded = 0  # of its cached prompt blocks, those copied back from the host tier at admission
        self.kept = 0  # its first blocks at high retention priority (the system prompt's, where the model keeps it)
        self.admitted = False
        self.done = False
        self.reported_cached = False
        self.extras = True  # its next delta carries more than a token: the cached count (once), log probabilities

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)

    def next_token(self, corpus: tuple[int, ...]) -> tuple[int | None, FinishReason | None]:
        """Generate one token: (the token, or None when an end or stop token ended the sequence; the finish)."""
        done = self.generated
        if done == self.end_at:
            return None, FinishReason.STOP
        size = len(corpus)
        token = corpus[self.cursor % size]
        self.cursor += 1
        if token in self.stops:
            if done >= self.min_tokens:
                return None, FinishReason.STOP
            for _ in range(size):  # masked before min_tokens: the next token that is not a stop token
                token = corpus[self.cursor % size]
                self.cursor += 1
                if token not in self.stops:
                    break
        self.generated = done + 1
        self.length += 1
        return token, FinishReason.LENGTH if self.generated >= self.max_new else None

    def logprob(self, token: int) -> float:
        """The chosen token's synthetic log probability, in [-1.45, -0.05]."""
        return -(0.05 + 1.4 * unit(token * 1_000_003 + self.generated * 7_919 + self.salt))

    def top_logprobs(self, token: int, logprob: float, count: int, corpus: tuple[int, ...]) -> list[tuple[int, float]]:
        """`count` alternatives, best first: the chosen token and others from the corpus, their probabilities
        halving from what the chosen one leaves."""
        left = 1.0 - math.exp(logprob)
        entries, seen = [(token, logprob)], {token}
        size = len(corpus)
        for step in range(1, size + 1):
            if len(entries) == count:
                break
            other = corpus[(self.cursor + 7 * step) % size]
            if other not in seen:
                seen.add(other)
                entries.append((other, math.log(max(left * 0.5 ** len(entries), 1e-30))))
        entries.sort(key=lambda entry: -entry[1])
        return entries[:count]
