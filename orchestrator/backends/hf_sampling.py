"""Per-request sampling for transformers' continuous batching: temperature, top-k, top-p and a seed that
belongs to the request, not to the batch.

transformers' manager samples with one torch generator for the whole batch, so a request's output
depends on what else is running. Here the manager is run greedy (argmax) and these processors do the
sampling: after temperature, top-k and top-p, `SeededDraw` draws one token by inverse CDF with a
uniform number derived only from (the request's seed, the token's position) by an integer hash, and
hands the manager scores whose argmax is that token. The same seed and prompt give the same text
whatever else the batch holds. Greedy requests pass through untouched.

Each processor reads one value per request (the manager's per-request argument rows). When no request
in the step needs a processor it is skipped; that decision is made on the host before the forward pass,
so the backend runs without CUDA graphs.
"""

from __future__ import annotations

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

_MASK64 = 0xFFFFFFFFFFFFFFFF
GREEDY = -1  # draw key of a request that takes the argmax
_KEY_RANGE = float(1 << 31)


def draw_key(seed: int, position: int) -> int:
    """A 31-bit key for one sampling step of one sequence (splitmix64 finaliser); key / 2**31 is its uniform."""
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


class _PerRequestValue(ContinuousBatchingLogitsProcessor):
    """One request-level value per row; `active` says whether any row in this step departs from neutral."""

    kwarg: str
    kind: type
    neutral: float | int
    ignored_kwargs = ()

    def __init__(self) -> None:
        self.supported_kwargs = {self.kwarg: self.kind}
        self.active = False

    def value_for(self, request) -> float | int:
        return request.state.logit_processor_kwargs.get(self.kwarg, self.neutral)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(self._pack([self.neutral] * int32_tensor.numel()).view(int32_tensor.shape))

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        values = [self.value_for(request) for request in requests_with_new_token]
        self.active = any(v != self.neutral for v in values)
        return self._pack(values)

    def _pack(self, values) -> torch.Tensor:
        if self.kind is float:
            return torch.tensor(values, dtype=torch.float32).view(torch.int32)
        return torch.tensor(values, dtype=torch.int32)

    def _unpack(self, tensor_arg: torch.Tensor, rows: int) -> torch.Tensor:
        tensor = tensor_arg[:rows]
        return tensor.view(torch.float32) if self.kind is float else tensor


class TemperatureScaling(_PerRequestValue):
    kwarg, kind, neutral = "temperature", float, 1.0

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return scores
        temperature = self._unpack(tensor_arg, scores.size(0))
        temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))  # 0: greedy
        return scores / temperature.unsqueeze(-1)


class TopKFilter(_PerRequestValue):
    kwarg, kind, neutral = "top_k", int, 0

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return scores
        vocab = scores.size(-1)
        k = self._unpack(tensor_arg, scores.size(0)).to(torch.int64)
        k = torch.where((k > 0) & (k < vocab), k, torch.full_like(k, vocab))
        largest = torch.topk(scores, int(k.max()), dim=-1).values  # sorted, descending
        kth_largest = largest.gather(-1, (k - 1).unsqueeze(-1))
        return scores.masked_fill(scores < kth_largest, float("-inf"))


class TopPFilter(_PerRequestValue):
    """Keeps the smallest set of most likely tokens whose mass reaches top_p.

    The nucleus is looked for among the `candidates` most likely tokens first (one cheap top-k); only
    rows whose nucleus is wider than that are fully sorted.
    """

    kwarg, kind, neutral = "top_p", float, 1.0
    candidates = 64

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return scores
        top_p = self._unpack(tensor_arg, scores.size(0)).unsqueeze(-1)
        probs = scores.softmax(dim=-1)
        ranked = torch.topk(probs, min(self.candidates, probs.size(-1)), dim=-1).values
        threshold = self._smallest_kept(ranked, top_p)
        wide = ranked.sum(dim=-1) < top_p.squeeze(-1)
        if wide.any():
            ranked_all = torch.sort(probs[wide], dim=-1, descending=True).values
            threshold[wide] = self._smallest_kept(ranked_all, top_p[wide])
        threshold = threshold.masked_fill(top_p >= 1, 0.0)
        return scores.masked_fill(probs < threshold, float("-inf"))

    @staticmethod
    def _smallest_kept(ranked: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        mass_before = ranked.cumsum(dim=-1) - ranked
        kept = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
        return ranked.gather(-1, kept - 1)


class SeededDraw(_PerRequestValue):
    """Last in line: draws each sampled request's token and leaves only it for the manager's argmax."""

    kwarg, kind, neutral = "sample_seed", int, GREEDY

    def value_for(self, request) -> int:
        seed = request.state.logit_processor_kwargs.get(self.kwarg)
        if seed is None:
            return GREEDY
        state = request.state
        return draw_key(seed, len(state.initial_tokens) + len(state.generated_tokens))

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return scores
        keys = self._unpack(tensor_arg, scores.size(0))
        sampled = keys != GREEDY
        cdf = scores[sampled].softmax(dim=-1).cumsum(dim=-1)
        uniform = (keys[sampled].to(torch.float32) + 0.5) / _KEY_RANGE
        target = (uniform * cdf[:, -1]).unsqueeze(-1)
        choice = torch.searchsorted(cdf, target, right=True).clamp_(max=scores.size(-1) - 1)
        drawn = torch.full_like(scores[sampled], float("-inf")).scatter_(-1, choice, 0.0)
        out = scores.clone()
        out[sampled] = drawn
        return out


def sampling_processors() -> ContinuousBatchingLogitsProcessorList:
    """The processor list the backend installs in its manager, in the order sampling needs."""
    processors = [TemperatureScaling(), TopKFilter(), TopPFilter(), SeededDraw()]
    chain = ContinuousBatchingLogitsProcessorList(LogitsProcessorList(processors))
    # The list counts argument rows only for processors it converted itself; these are already per-request.
    chain.tensors_required = len(processors)
    return chain


def processor_kwargs(sampling) -> dict:
    """add_request keyword arguments for a request's SamplingParams."""
    if sampling.greedy:
        return {}
    return {
        "temperature": float(sampling.temperature),
        "top_k": int(sampling.top_k),
        "top_p": float(sampling.top_p),
        "sample_seed": int(sampling.seed),
    }
