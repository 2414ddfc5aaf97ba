"""What crosses the engine boundary: a frozen, checked request in; one token delta per request per step out.

The HTTP layer builds an `EngineRequest` once from the validated wire request (`to_inference_request` in
api/wire.py); backends never see JSON, chat messages or HTTP. One EngineRequest is one sequence: `n` choices are
`n` EngineRequests sharing a prompt (the engines' prefix caches make the shared prompt cheap).

`FIELD_BOUNDS` holds the bounds every backend can honour. The wire types take their field constraints from it, and
the worker checks every request against it again (`check_request`) before a backend sees it, so no value can
reach an engine loop unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum

from orchestrator.errors import InfernoError, InvalidRequest
from orchestrator.structured.guide import Guide

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class FieldBounds:
    """Bounds of every numeric request field, the same for every backend."""

    max_new_tokens: int = INT32_MAX  # the engine's sequence length is checked against it separately
    top_k: int = INT32_MAX  # values above the vocabulary mean "all of it"
    seed_min: int = INT64_MIN
    seed_max: int = INT64_MAX
    temperature: float = 2.0
    penalty: float = 2.0  # presence and frequency penalties lie in [-penalty, penalty]
    repetition_penalty: float = 10.0  # in [1 / repetition_penalty, repetition_penalty]: a tiny divisor would
    # overflow a float32 logit to infinity (and rounds to 0 in TensorRT-LLM's float32 SamplingConfig)
    logit_bias: float = 100.0  # each bias in [-logit_bias, logit_bias]
    logit_bias_entries: int = 300
    stop_strings: int = 16
    stop_string_chars: int = 1000
    stop_token_ids: int = 64
    top_logprobs: int = 20
    choices: int = 16


FIELD_BOUNDS = FieldBounds()


class FinishReason(StrEnum):
    """How one sequence ended. The value is its name everywhere inside Inferno (wire rows, logs); `openai` is what
    a client reads as `finish_reason` (None: the request ended without an answer to give that reason)."""

    STOP = "stop"  # end token, stop token or stop string
    TOOL_CALLS = "tool_calls"  # the answer is tool calls (the worker's parser found them)
    LENGTH = "length"  # max_tokens, or the engine's sequence limit
    CANCELLED = "cancelled"  # stopped by cancel(): the client went away, or the server ended the request early
    ERROR = "error"  # the engine failed this request

    @property
    def openai(self) -> str | None:
        return _OPENAI_FINISH.get(self)


_OPENAI_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.TOOL_CALLS: "tool_calls"}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means the whole vocabulary
    seed: int = 0  # every sampled request carries one: drawn at random when the client gives none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 changes nothing; > 1 makes tokens already seen less likely
    min_p: float = 0.0  # drop tokens below min_p times the most likely token's probability
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), sorted by id

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class EngineRequest:
    id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()  # matched on detokenised text, never part of the output unless asked
    stop_token_ids: tuple[int, ...] = ()  # end the sequence like an end token; not part of the text
    ignore_eos: bool = False  # end tokens do not end the sequence (max_new_tokens or a stop does)
    min_tokens: int = 0  # no end token, stop token or stop string ends the sequence before this many tokens
    include_stop_str_in_output: bool = False  # a stop string that ends the text stays part of it
    priority: int = 0  # higher runs first where the backend supports priorities
    logprobs: bool = False  # return each generated token's log probability
    top_logprobs: int = 0  # and this many most likely alternatives per position
    guide: Guide | None = None  # the output must follow this grammar (checked before admission)
    tool_calls: str = ""  # parse tool calls from the text: "" no, "auto" (text or calls), "forced" (calls only)
    reasoning: bool = False  # split the model's thinking from its answer
    # Leading prompt tokens before the first user message (system prompt, tool definitions): what every turn of a
    # conversation repeats, kept longest in the KV cache where the model's retain_system_prompt setting says so
    system_prefix_tokens: int = 0
    # Whose prefix cache this request may read and add to: prompt tokens computed for a request are reused only by
    # requests with the same salt (made by the HTTP layer from the caller's key or the request's own `cache_salt`,
    # api/cache_salt.py); "" is the salt of anonymous callers and of the server's own requests
    cache_salt: str = ""

    def to_wire(self) -> dict:
        """Plain JSON values, field by field (dataclasses.asdict deep-copies: a few times slower, per request)."""
        wire = {name: getattr(self, name) for name in _REQUEST_FIELDS}
        wire["sampling"] = {name: getattr(self.sampling, name) for name in _SAMPLING_FIELDS}
        wire["guide"] = self.guide.to_wire() if self.guide is not None else None
        return wire

    @classmethod
    def from_wire(cls, data: dict) -> EngineRequest:
        sampling = dict(data["sampling"])
        sampling["logit_bias"] = tuple((int(t), float(b)) for t, b in sampling.get("logit_bias", ()))
        return cls(id=data["id"], prompt_ids=tuple(data["prompt_ids"]), max_new_tokens=data["max_new_tokens"],
                   sampling=SamplingParams(**sampling), stop=tuple(data["stop"]),
                   stop_token_ids=tuple(data.get("stop_token_ids", ())),
                   ignore_eos=data.get("ignore_eos", False), min_tokens=data.get("min_tokens", 0),
                   include_stop_str_in_output=data.get("include_stop_str_in_output", False),
                   priority=data["priority"], logprobs=data.get("logprobs", False),
                   top_logprobs=data.get("top_logprobs", 0),
                   guide=Guide.from_wire(data["guide"]) if data.get("guide") else None,
                   tool_calls=data.get("tool_calls", ""), reasoning=data.get("reasoning", False),
                   system_prefix_tokens=data.get("system_prefix_tokens", 0),
                   cache_salt=data.get("cache_salt", ""))


_REQUEST_FIELDS = tuple(f.name for f in fields(EngineRequest) if f.name not in ("sampling", "guide"))
_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


def check_request(request: EngineRequest, vocab_size: int) -> None:
    """Raise InvalidRequest naming the first value outside what every backend can honour.

    The HTTP layer already refuses these at the wire; the worker calls this again before a backend sees the
    request, so a value that slipped through fails its own request instead of an engine loop."""
    s, limits = request.sampling, FIELD_BOUNDS
    checks = [
        ("max_tokens", request.max_new_tokens, 1 <= request.max_new_tokens <= limits.max_new_tokens),
        ("min_tokens", request.min_tokens, 0 <= request.min_tokens <= request.max_new_tokens),
        ("temperature", s.temperature, 0.0 <= s.temperature <= limits.temperature),
        ("top_p", s.top_p, 0.0 < s.top_p <= 1.0),
        ("top_k", s.top_k, 0 <= s.top_k <= limits.top_k),
        ("min_p", s.min_p, 0.0 <= s.min_p <= 1.0),
        ("seed", s.seed, limits.seed_min <= s.seed <= limits.seed_max),
        ("presence_penalty", s.presence_penalty, -limits.penalty <= s.presence_penalty <= limits.penalty),
        ("frequency_penalty", s.frequency_penalty, -limits.penalty <= s.frequency_penalty <= limits.penalty),
        ("repetition_penalty", s.repetition_penalty,
         1 / limits.repetition_penalty <= s.repetition_penalty <= limits.repetition_penalty),
        ("top_logprobs", request.top_logprobs, 0 <= request.top_logprobs <= limits.top_logprobs),
        ("system_prefix_tokens", request.system_prefix_tokens,
         0 <= request.system_prefix_tokens <= len(request.prompt_ids)),
        ("logit_bias", len(s.logit_bias), len(s.logit_bias) <= limits.logit_bias_entries),
        ("stop", len(request.stop), len(request.stop) <= limits.stop_strings),
        ("stop_token_ids", len(request.stop_token_ids), len(request.stop_token_ids) <= limits.stop_token_ids),
    ]
    for name, value, ok in checks:
        if not ok:
            raise InvalidRequest(f"{name} is out of range (got {value!r:.80})", param=name)
    for name, ids in (("prompt", request.prompt_ids), ("stop_token_ids", request.stop_token_ids),
                      ("logit_bias", [t for t, _ in s.logit_bias])):
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):  # in C: no Python step per prompt token
            token = next(t for t in ids if not 0 <= t < vocab_size)
            raise InvalidRequest(f"{name}: token id {token} is not in this model's vocabulary [0, {vocab_size})", param=name)
    for _, bias in s.logit_bias:
        if not -limits.logit_bias <= bias <= limits.logit_bias:
            raise InvalidRequest(f"logit_bias values must lie in [-100, 100] (got {bias!r})", param="logit_bias")
    if request.guide is not None and (request.ignore_eos or request.min_tokens):
        raise InvalidRequest("an output constraint ends at its grammar's end: ignore_eos and min_tokens cannot "
                             "be combined with it", param="ignore_eos" if request.ignore_eos else "min_tokens")
    if any(len(stop) > limits.stop_string_chars for stop in request.stop):
        raise InvalidRequest(f"stop strings are limited to {limits.stop_string_chars} characters", param="stop")


@dataclass(slots=True)
class TokenDelta:
    """A backend's output for one request after one engine step: only the new tokens.

    End tokens and stop tokens are not part of `token_ids`: they end the sequence (finish=STOP) and are not
    text. Exactly one delta per request has `finish` set, and it is the request's last.
    """

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    error: InfernoError | None = None  # with finish=ERROR: what failed, as the user should see it
    logprobs: list[float] | None = None  # one per token in token_ids, when the request asked for them
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: the top alternatives, best first
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, once, where the engine knows

    def keep(self, count: int) -> None:
        """Cut the delta to its first `count` tokens, their log probabilities with them."""
        for values in (self.token_ids, self.logprobs, self.top_logprobs):
            if values is not None:
                del values[count:]
