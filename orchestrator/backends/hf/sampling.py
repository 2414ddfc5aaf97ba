"""Per-request sampling for transformers' continuous batching: logit bias, penalties, min_tokens, temperature,
top-k, top-p, min-p, a seed that belongs to the request, and log probabilities.

transformers' manager samples with one torch generator for the whole batch, so a request's output would
depend on what else is running. Here the manager is run greedy (argmax) and these processors do the
sampling: after the adjustments and filters, `SeededDraw` draws one token by inverse CDF with a uniform
number derived only from (the request's seed, the token's position) by an integer hash, and hands the
manager scores whose argmax is that token. The same seed and prompt give the same text whatever else the
batch holds. Greedy requests pass through the filters untouched.

Each processor reads its values per request (the manager's per-request argument rows) when the step is
prepared, on the manager's thread, right before the forward pass that uses them (the backend runs the
manager without asynchronous batching, so a request's tokens so far are known then). When no request in
the step needs a processor, it is skipped; that decision is made on the host, so the backend runs without
CUDA graphs. Values arrive checked (engine/request.py: check_request); processors still clamp what they
tensorise, because an exception here would stop the engine loop for every request.
"""

from __future__ import annotations

from collections import deque

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

from orchestrator.backends.draws import KEY_RANGE, draw_key

GREEDY = -1  # draw key of a request that takes the argmax
_INT32_MAX = 2**31 - 1


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
        return torch.tensor([min(max(int(v), -_INT32_MAX), _INT32_MAX) for v in values], dtype=torch.int32)

    def _unpack(self, tensor_arg: torch.Tensor, rows: int) -> torch.Tensor:
        tensor = tensor_arg[:rows]
        return tensor.view(torch.float32) if self.kind is float else tensor


class _PerRequestRows(ContinuousBatchingLogitsProcessor):
    """A processor whose per-request data is not one number (token lists, maps): it keeps the step's rows on
    itself when the step is prepared, and its argument row only says which rows take part."""

    kwargs: dict[str, type]
    ignored_kwargs = ()

    def __init__(self) -> None:
        self.supported_kwargs = dict(self.kwargs)
        self.rows: list = []

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.zero_()

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        self.rows = [self.row_for(request) for request in requests_with_new_token]
        return torch.tensor([row is not None for row in self.rows], dtype=torch.int32)

    def row_for(self, request):
        raise NotImplementedError


class GuidedMask(_PerRequestRows):
    """First in line: each constrained request's grammar (structured/grammar/matcher.py) accepts the tokens produced
    since the last step and masks every token it forbids. Rows without a grammar are untouched."""

    kwargs = {"guide_state": object}

    def __init__(self) -> None:
        super().__init__()
        self.masker = None  # structured.grammar.matcher.GuidedBatchMasker, set by the backend with the first grammar

    def row_for(self, request):
        state = request.state.logit_processor_kwargs.get("guide_state")
        if state is not None:
            state.advance(request.state.generated_tokens)
        return state

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = [(index, state) for index, state in enumerate(self.rows[: scores.size(0)]) if state is not None]
        if rows:
            self.masker.apply(scores, rows)
        return scores


class LogitAdjustments(_PerRequestRows):
    """First in line: logit bias, repetition / presence / frequency penalties, and the min_tokens ban on the
    tokens that would end the sequence. Penalties follow vLLM: repetition over prompt and output, presence
    and frequency over the output only."""

    kwargs = {"logit_bias": tuple, "repetition_penalty": float, "presence_penalty": float,
              "frequency_penalty": float, "min_tokens": int, "end_tokens": tuple}

    def row_for(self, request):
        kwargs = request.state.logit_processor_kwargs
        state = request.state
        banned = kwargs.get("end_tokens", ()) if len(state.generated_tokens) < kwargs.get("min_tokens", 0) else ()
        row = (kwargs.get("logit_bias", ()), kwargs.get("repetition_penalty", 1.0), kwargs.get("presence_penalty", 0.0),
               kwargs.get("frequency_penalty", 0.0), banned)
        return None if row == ((), 1.0, 0.0, 0.0, ()) else (row, state)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not any(row is not None for row in self.rows):
            return scores
        vocab = scores.size(-1)
        for index, entry in enumerate(self.rows[: scores.size(0)]):
            if entry is not None:
                self._adjust(scores[index], entry, vocab)
        return scores

    @staticmethod
    def _adjust(row: torch.Tensor, entry, vocab: int) -> None:
        (bias, repetition, presence, frequency, banned), state = entry
        if bias:
            ids = torch.tensor([t for t, _ in bias if t < vocab], dtype=torch.long)
            row.index_add_(0, ids, torch.tensor([b for t, b in bias if t < vocab], dtype=row.dtype))
        if repetition != 1.0:
            seen = torch.tensor(sorted({t for t in (*state.initial_tokens, *state.generated_tokens) if t < vocab}),
                                dtype=torch.long)
            values = row[seen]
            row[seen] = torch.where(values > 0, values / repetition, values * repetition)
        if (presence or frequency) and state.generated_tokens:
            ids, counts = torch.tensor([t for t in state.generated_tokens if t < vocab], dtype=torch.long).unique(
                return_counts=True)
            row.index_add_(0, ids, -(presence + frequency * counts.to(row.dtype)))
        if banned:
            row[torch.tensor([t for t in banned if t < vocab], dtype=torch.long)] = float("-inf")


class TemperatureScaling(_PerRequestValue):
    """The first processor that shapes the draw rather than the model's distribution: `before`, when given, sees
    the scores as they are here (after the grammar, bias and penalties), for log probabilities."""

    kwarg, kind, neutral = "temperature", float, 1.0

    def __init__(self, before=None) -> None:
        super().__init__()
        self.before = before

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if self.before is not None:
            self.before(scores)
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


class MinPFilter(_PerRequestValue):
    """Drops tokens whose probability is below min_p times the most likely token's."""

    kwarg, kind, neutral = "min_p", float, 0.0

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return scores
        min_p = self._unpack(tensor_arg, scores.size(0)).unsqueeze(-1)
        probs = scores.softmax(dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * min_p
        return scores.masked_fill(probs < threshold, float("-inf"))


class SeededDraw(_PerRequestValue):
    """Last in line: draws each sampled request's token and leaves only it for the manager's argmax; and, for
    requests that asked, records the chosen token's log probability and the most likely alternatives under the
    model's distribution: the scores `snapshot` saw (TemperatureScaling calls it), after the grammar, bias and
    penalties, before temperature, top-k, top-p and min-p, which shape the draw, not what the model thinks."""

    kwarg, kind, neutral = "sample_seed", int, GREEDY

    def __init__(self) -> None:
        super().__init__()
        self.supported_kwargs["top_logprobs"] = int
        self.logprobs = LogprobRecords()
        self._wanted: list[tuple[int, str, int]] = []  # (row, request id, alternatives) of rows that asked
        self._model_logprobs: torch.Tensor | None = None  # the wanted rows' log-softmax, from `snapshot`

    def snapshot(self, scores: torch.Tensor) -> None:
        self._model_logprobs = scores[[row for row, _, _ in self._wanted]].log_softmax(dim=-1) if self._wanted else None

    def value_for(self, request) -> int:
        state = request.state
        seed = state.logit_processor_kwargs.get(self.kwarg)
        return GREEDY if seed is None else draw_key(seed, len(state.initial_tokens) + len(state.generated_tokens))

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        self._wanted = [
            (row, request.state.request_id, alternatives)
            for row, request in enumerate(requests_with_new_token)
            if (alternatives := request.state.logit_processor_kwargs.get("top_logprobs", -1)) >= 0
        ]
        return super().prepare_tensor_args(requests_with_new_token)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not self.active and not self._wanted:
            return scores
        keys = self._unpack(tensor_arg, scores.size(0))
        sampled = keys != GREEDY
        chosen = scores.argmax(dim=-1)
        out = scores
        if self.active:
            cdf = scores[sampled].softmax(dim=-1).cumsum(dim=-1)
            uniform = (keys[sampled].to(torch.float32) + 0.5) / KEY_RANGE
            target = (uniform * cdf[:, -1]).unsqueeze(-1)
            drawn = torch.searchsorted(cdf, target, right=True).clamp_(max=scores.size(-1) - 1)
            chosen[sampled] = drawn.squeeze(-1)
            out = scores.clone()
            out[sampled] = torch.full_like(scores[sampled], float("-inf")).scatter_(-1, drawn, 0.0)
        if self._wanted:
            self._record(scores, chosen)
        return out

    def _record(self, scores: torch.Tensor, chosen: torch.Tensor) -> None:
        logprobs = self._model_logprobs
        if logprobs is None:  # no TemperatureScaling before this one: the scores it was given
            logprobs = scores[[row for row, _, _ in self._wanted]].log_softmax(dim=-1)
        self._model_logprobs = None
        most = max(alternatives for _, _, alternatives in self._wanted)
        top = torch.topk(logprobs, most, dim=-1) if most else None
        for i, (row, request_id, alternatives) in enumerate(self._wanted):
            token = int(chosen[row])
            alts = list(zip(top.indices[i, :alternatives].tolist(), top.values[i, :alternatives].tolist(),
                            strict=True)) if alternatives else []
            self.logprobs.add(request_id, float(logprobs[i, token]), alts)


class LogprobRecords:
    """Log probabilities recorded on the manager's thread, taken by the backend on the event loop, in token
    order per request (deque appends and pops are thread-safe)."""

    def __init__(self) -> None:
        self._by_request: dict[str, deque] = {}

    def open(self, request_id: str) -> None:
        self._by_request[request_id] = deque()

    def add(self, request_id: str, logprob: float, alternatives: list[tuple[int, float]]) -> None:
        records = self._by_request.get(request_id)
        if records is not None:
            records.append((logprob, alternatives))

    def take(self, request_id: str, count: int) -> list[tuple[float, list]]:
        records = self._by_request.get(request_id) or ()
        return [records.popleft() for _ in range(min(count, len(records)))]

    def close(self, request_id: str) -> None:
        self._by_request.pop(request_id, None)


def sampling_processors() -> ContinuousBatchingLogitsProcessorList:
    """The processor list the backend installs in its manager, in the order sampling needs."""
    draw = SeededDraw()
    processors = [GuidedMask(), LogitAdjustments(), TemperatureScaling(before=draw.snapshot), TopKFilter(),
                  TopPFilter(), MinPFilter(), draw]
    chain = ContinuousBatchingLogitsProcessorList(LogitsProcessorList(processors))
    # The list counts argument rows only for processors it converted itself; these are already per-request.
    chain.tensors_required = len(processors)
    return chain


def processor_kwargs(request, end_tokens: frozenset[int], guide_state=None) -> dict:
    """add_request keyword arguments for an EngineRequest (neutral values are left out); `end_tokens` are the
    tokens that would end it, banned before its min_tokens; `guide_state` its grammar's state, if it has one."""
    sampling = request.sampling
    kwargs: dict = {} if guide_state is None else {"guide_state": guide_state}
    if request.min_tokens and end_tokens:
        kwargs.update(min_tokens=int(request.min_tokens), end_tokens=tuple(sorted(end_tokens)))
    if not sampling.greedy:
        kwargs.update(temperature=float(sampling.temperature), top_k=int(sampling.top_k), top_p=float(sampling.top_p),
                      min_p=float(sampling.min_p), sample_seed=int(sampling.seed))
    if sampling.logit_bias:
        kwargs["logit_bias"] = tuple(sampling.logit_bias)
    if sampling.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = float(sampling.repetition_penalty)
    if sampling.presence_penalty:
        kwargs["presence_penalty"] = float(sampling.presence_penalty)
    if sampling.frequency_penalty:
        kwargs["frequency_penalty"] = float(sampling.frequency_penalty)
    if request.logprobs:
        kwargs["top_logprobs"] = int(request.top_logprobs)
    return kwargs
