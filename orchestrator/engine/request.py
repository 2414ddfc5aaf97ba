"""What crosses the engine boundary: a frozen, checked request in; token deltas out.

The HTTP layer builds an `EngineRequest` once from the validated wire request (`to_inference_request`);
backends never see JSON, chat messages or HTTP. One EngineRequest is one sequence: `n` choices are `n`
EngineRequests sharing a prompt (the engines' prefix caches make the shared prompt cheap).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # end token, stop token or stop string
    LENGTH = "length"  # max_tokens, or the engine's sequence limit
    CANCELLED = "cancelled"  # stopped by cancel(): the client went away, or the server ended the request early
    ERROR = "error"  # the engine failed this request


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means the whole vocabulary
    seed: int = 0  # every sampled request carries one: drawn at random when the client gives none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class EngineRequest:
    id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()  # matched on detokenised text, never part of the output
    priority: int = 0  # higher runs first where the backend supports priorities
    logprobs: bool = False  # return each generated token's log probability, where the backend can

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict) -> EngineRequest:
        return cls(
            id=data["id"],
            prompt_ids=tuple(data["prompt_ids"]),
            max_new_tokens=data["max_new_tokens"],
            sampling=SamplingParams(**data["sampling"]),
            stop=tuple(data["stop"]),
            priority=data["priority"],
            logprobs=data.get("logprobs", False),
        )


@dataclass(slots=True)
class TokenDelta:
    """A backend's output for one request after one engine step: only the new tokens.

    End tokens are not part of `token_ids`: they end the sequence (finish=STOP) and are not text.
    """

    token_ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    error: str | None = None
    logprobs: list[float] | None = None  # one per token in token_ids, when the request asked for them


@dataclass(slots=True)
class TextDelta:
    """What the worker sends back per request per engine step: new text, ready to stream."""

    request_id: str
    text: str
    num_tokens: int  # tokens this delta accounts for (text may lag tokens across a split character)
    finish: FinishReason | None = None
    error: dict | None = None  # errors.to_wire() of the failure, with finish=ERROR
    logprobs: list[tuple[str, float]] | None = None  # (token text, log probability) per token, when asked

    def to_wire(self) -> list:
        row = [self.request_id, self.text, self.num_tokens, self.finish and self.finish.value, self.error]
        return row if self.logprobs is None else [*row, self.logprobs]

    @classmethod
    def from_wire(cls, row: list) -> TextDelta:
        rid, text, num_tokens, finish, error, *rest = row
        logprobs = [tuple(pair) for pair in rest[0]] if rest else None
        return cls(rid, text, num_tokens, FinishReason(finish) if finish else None, error, logprobs)
