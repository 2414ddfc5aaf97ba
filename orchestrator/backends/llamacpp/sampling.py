"""Per-sequence sampling over one step's logits matrix, in numpy: no llama_sampler chains.

llama.cpp's samplers fill a full-vocabulary candidate array per sequence per step in C (~40 µs greedy, ~350 µs
for temperature sampling without top-k over a 49k vocabulary); numpy over the rows of `llama_get_logits` does
the same work in a fraction of that (docs/llamacpp.md has the measurements). Each sequence is processed in
this order, the same as the hf backend's processors:

1. adjustments, in place on the sequence's row: logit_bias; repetition penalty (prompt and output tokens,
   positive logits divided, negative multiplied); presence and frequency penalties (output tokens only); end
   and stop tokens banned before min_tokens; then the sequence's token constraint (structured outputs), if it
   has one: **the place where a grammar's token mask is applied**, after everything that could raise a
   token's logit, so nothing the grammar forbids can be chosen;
2. greedy sequences (temperature 0) take the argmax of the adjusted row, all together;
3. sampled sequences: temperature, then top-k, top-p and min-p filters, then one draw by inverse CDF with a
   uniform number derived only from (the request's seed, the token's position) by an integer hash
   (splitmix64, backends/draws.py, as in hf_sampling). The same seed and prompt give the same tokens whatever the batch holds.

Log probabilities come from the same distribution that chose the token: the adjusted row for greedy
sequences, the filtered and renormalised distribution for sampled ones (tokens the filters removed have no
probability and are not listed among the alternatives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from orchestrator.backends.draws import KEY_RANGE, draw_key
from orchestrator.engine.request import EngineRequest

NUCLEUS_CANDIDATES = (64, 1024)  # top-p looks for its nucleus among this many best tokens before sorting all


class TokenConstraint(Protocol):
    """What structured outputs hand a sequence (orchestrator/structured/, e.g. an xgrammar matcher): `apply`
    sets the logits of every token the grammar forbids now to -inf, in place; `accept` advances the grammar by
    the token chosen."""

    def apply(self, row: np.ndarray) -> None: ...

    def accept(self, token: int) -> None: ...


@dataclass(slots=True)
class SequenceSampler:
    """One sequence's sampling settings and the history its penalties need."""

    request: EngineRequest
    end_tokens: np.ndarray  # tokens that would end it: banned before min_tokens
    vocab: int
    generated: int = 0
    constraint: TokenConstraint | None = None
    _bias_ids: np.ndarray | None = None
    _bias_values: np.ndarray | None = None
    _seen: np.ndarray | None = None  # bool [vocab]: prompt and output tokens (repetition penalty)
    _counts: np.ndarray | None = None  # int32 [vocab]: output token counts (presence, frequency)
    _adjusts: bool = field(default=False)
    _argmax_only: bool = field(default=False)  # greedy, no logit bias or penalties, no log probabilities
    _bans_until: int = field(default=0)  # end tokens are banned while fewer than this many tokens are generated

    def __post_init__(self) -> None:
        s = self.request.sampling
        if s.logit_bias:
            self._bias_ids = np.array([t for t, _ in s.logit_bias], dtype=np.int64)
            self._bias_values = np.array([b for _, b in s.logit_bias], dtype=np.float32)
        if s.repetition_penalty != 1.0:
            self._seen = np.zeros(self.vocab, dtype=bool)
            self._seen[np.asarray(self.request.prompt_ids, dtype=np.int64)] = True
        if s.presence_penalty or s.frequency_penalty:
            self._counts = np.zeros(self.vocab, dtype=np.int32)
        self._adjusts = bool(s.logit_bias) or self._seen is not None or self._counts is not None
        self._argmax_only = s.greedy and not self._adjusts and not self.request.logprobs
        self._bans_until = self.request.min_tokens if len(self.end_tokens) else 0

    @property
    def position(self) -> int:
        return len(self.request.prompt_ids) + self.generated

    def needs_adjusting(self) -> bool:
        return self._adjusts or self.generated < self._bans_until or self.constraint is not None

    def argmax_only(self) -> bool:
        """Whether its token is the argmax of its row as the model gave it, with nothing else to report: greedy,
        nothing to adjust at this position, no log probabilities."""
        return self._argmax_only and self.constraint is None and self.generated >= self._bans_until

    def adjust(self, row: np.ndarray) -> None:
        """Step 1 above, in place."""
        s = self.request.sampling
        if self._bias_ids is not None:
            row[self._bias_ids] += self._bias_values
        if self._seen is not None:
            ids = np.flatnonzero(self._seen)
            values = row[ids]
            row[ids] = np.where(values > 0, values / s.repetition_penalty, values * s.repetition_penalty)
        if self._counts is not None:
            ids = np.flatnonzero(self._counts)
            row[ids] -= s.presence_penalty + s.frequency_penalty * self._counts[ids]
        if self.generated < self.request.min_tokens and len(self.end_tokens):
            row[self.end_tokens] = -np.inf
        if self.constraint is not None:
            self.constraint.apply(row)

    def accept(self, token: int) -> None:
        """Record the token chosen for this sequence."""
        self.generated += 1
        if self._seen is not None:
            self._seen[token] = True
        if self._counts is not None:
            self._counts[token] += 1
        if self.constraint is not None:
            self.constraint.accept(token)


@dataclass(slots=True)
class Sampled:
    """What sampling chose for one row."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    error: str | None = None  # the sequence cannot go on: its constraint forbade every token


def sample(logits: np.ndarray, samplers: list[SequenceSampler]) -> list[Sampled]:
    """Choose one token per row of `logits` ([rows, vocab], modified in place) for the sequence in the same
    place of `samplers`. Does not call `accept`: the caller does once the token is kept. A row whose sampling
    raises (its constraint, say) gets a `Sampled` with the error; the other rows are chosen as if it were not
    there."""
    if all(sampler.argmax_only() for sampler in samplers):
        fast = _argmax_rows(logits)
        if fast is not None:
            return fast
    choices: list[Sampled | None] = [None] * len(samplers)
    for index, sampler in enumerate(samplers):
        if sampler.needs_adjusting():
            choices[index] = _guarded(sampler.adjust, logits[index])
    greedy = [i for i, s in enumerate(samplers) if s.request.sampling.greedy and choices[i] is None]
    if greedy:
        rows = logits if len(greedy) == len(samplers) else logits[greedy]
        for i, token in zip(greedy, np.argmax(rows, axis=1).tolist(), strict=True):
            choices[i] = _guarded(_greedy_choice, logits[i], token, samplers[i].request)
    for i, sampler in enumerate(samplers):
        if choices[i] is None:
            choices[i] = _guarded(_sampled_choice, logits[i], sampler)
    return choices


def _argmax_rows(logits: np.ndarray) -> list[Sampled] | None:
    """Every row's argmax, in one pass over the matrix (a plain greedy batch, the common case); None when a row
    has no finite best logit (the general path reports it for that row alone)."""
    if len(logits) == 1:  # one sequence: fewer numpy calls (each costs ~10x its warm time after a decode)
        token = int(logits[0].argmax())
        return [Sampled(token)] if math.isfinite(logits[0, token]) else None
    tokens = logits.argmax(axis=1)
    if not np.isfinite(logits[np.arange(tokens.size), tokens]).all():
        return None
    return [Sampled(token) for token in tokens.tolist()]


def _guarded(work, *args) -> Sampled | None:
    """`work(*args)`, or a failed `Sampled` naming what it raised."""
    try:
        return work(*args)
    except Exception as exc:  # one sequence's sampling must not stop the step of every other
        return Sampled(0, error=f"sampling failed: {type(exc).__name__}: {exc}")


def _logsumexp(values: np.ndarray) -> float:
    top = float(values.max())
    return top + float(np.log(np.exp(values - top).sum()))


def _top(values: np.ndarray, count: int) -> np.ndarray:
    """Indices of the `count` largest values, best first (ties: lower index first)."""
    count = min(count, values.size)
    part = np.argpartition(-values, count - 1)[:count] if count < values.size else np.arange(values.size)
    return part[np.lexsort((part, -values[part]))]


def _greedy_choice(row: np.ndarray, token: int, request: EngineRequest) -> Sampled:
    if not np.isfinite(row[token]):
        return Sampled(token, error="no token is allowed at this position")
    return _with_logprobs(row, token, request)


def _with_logprobs(row: np.ndarray, token: int, request: EngineRequest) -> Sampled:
    """The choice, with its log probability and the `top_logprobs` most likely tokens where asked: under the
    model's distribution for this row (after the request's logit bias, penalties and grammar), before
    temperature, top-k, top-p and min-p, which shape the draw, not what the model thinks (as OpenAI reports)."""
    if not request.logprobs:
        return Sampled(token)
    lse = _logsumexp(row)
    top = None
    if request.top_logprobs:
        best = _top(row, request.top_logprobs)
        top = [(int(t), float(row[t] - lse)) for t in best if np.isfinite(row[t])]
    return Sampled(token, float(row[token] - lse), top)


def _kept(scaled: np.ndarray, s) -> tuple[np.ndarray | None, np.ndarray]:
    """The tokens top-k and top-p keep (None: all of them) and their probabilities under `scaled`."""
    lse = _logsumexp(scaled)
    vocab = scaled.size
    if 0 < s.top_k < vocab:
        ids = _top(scaled, s.top_k)
        probs = np.exp(scaled[ids] - lse)
        total = float(probs.sum())  # top-p applies to what top-k kept, renormalised
    elif s.top_p < 1.0:
        total = 1.0
        ids = probs = None
        for count in NUCLEUS_CANDIDATES:
            ids = _top(scaled, count)
            probs = np.exp(scaled[ids] - lse)
            if probs.sum() >= s.top_p:
                break
        else:
            return _wide_nucleus(np.exp(scaled - lse), s.top_p, float(probs[-1]))
    else:
        return None, np.exp(scaled - lse)
    if s.top_p < 1.0:
        mass_before = np.cumsum(probs) - probs
        keep = max(1, int((mass_before < s.top_p * total).sum()))
        ids, probs = ids[:keep], probs[:keep]
    return ids, probs


def _wide_nucleus(probs: np.ndarray, top_p: float, below: float) -> tuple[np.ndarray, np.ndarray]:
    """A nucleus wider than the candidates tried: the smallest probability threshold whose tokens reach
    `top_p`, found by bisection under `below` (no full sort); the tokens in id order."""
    low, high = 0.0, below
    for _ in range(40):
        middle = (low + high) / 2
        if probs[probs >= middle].sum() >= top_p:
            low = middle
        else:
            high = middle
    ids = np.flatnonzero(probs >= low)
    return ids, probs[ids]


def _sampled_choice(row: np.ndarray, sampler: SequenceSampler) -> Sampled:
    s = sampler.request.sampling
    if not np.isfinite(row.max()):
        return Sampled(0, error="no token is allowed at this position")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = row / np.float32(s.temperature)
    if not np.isfinite(scaled.max()):  # a temperature so small the row overflows: its limit, the argmax
        return _greedy_choice(row, int(np.argmax(row)), sampler.request)
    ids, probs = _kept(scaled, s)
    if s.min_p > 0.0:
        keep = probs >= s.min_p * probs.max()
        ids = np.flatnonzero(keep) if ids is None else ids[keep]
        probs = probs[keep]
    probs = probs / probs.sum()
    uniform = (draw_key(s.seed, sampler.position) + 0.5) / KEY_RANGE
    at = min(int(np.searchsorted(np.cumsum(probs), uniform, side="right")), probs.size - 1)
    while probs[at] == 0.0:  # never land on a token the filters removed (a zero-width step of the CDF)
        at -= 1
    return _with_logprobs(row, int(at if ids is None else ids[at]), sampler.request)
