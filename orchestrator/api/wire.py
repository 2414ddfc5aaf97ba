"""OpenAI's request bodies as pydantic types, and their one conversion into engine requests.

Validation errors name the field; anything OpenAI accepts that this server cannot honour is refused
with a 400 that says so, never silently ignored.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.backends import features_of
from orchestrator.engine.catalogue import Engine
from orchestrator.engine.request import EngineRequest, SamplingParams
from orchestrator.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter
from orchestrator.lifecycle import Choice, InferenceRequest

MAX_STOP_STRINGS = 16
MAX_CHOICES = 16


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Wire):
    include_usage: bool = False


class TextPart(_Wire):
    type: Literal["text"]
    text: str


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


def _seed_for_choice(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) & 0x7FFFFFFFFFFFFFFF


class _GenerationRequest(_Wire):
    """Fields chat and text completions share."""

    PROMPT_PARAM: ClassVar[str] = "prompt"

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None  # an extension many servers accept
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    user: str | None = None
    service_tier: str | None = None  # "flex" runs as batch priority, "priority" as interactive
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_tokens"

    def prompt_ids(self, engine: Engine) -> list[int]:
        raise NotImplementedError

    def wants_logprobs(self) -> bool:
        raise NotImplementedError

    def top_logprobs_asked(self) -> int:
        raise NotImplementedError

    def _check_supported(self, engine: Engine) -> None:
        features = features_of(engine.manifest)
        if self.wants_logprobs() and not features.logprobs:
            raise UnsupportedParameter(
                f"logprobs are not supported by the '{engine.manifest.backend}' backend that serves model "
                f"'{engine.name}'",
                param="logprobs",
            )
        if self.top_logprobs_asked():
            raise UnsupportedParameter(
                "only the chosen token's log probability is available: ask for 0 alternatives",
                param=self.TOP_LOGPROBS_PARAM,
            )
        if self.logit_bias:
            raise UnsupportedParameter("logit_bias is not supported by this server", param="logit_bias")
        if (self.presence_penalty or self.frequency_penalty) and not features.penalties:
            raise UnsupportedParameter(
                f"presence_penalty and frequency_penalty are not supported by the '{engine.manifest.backend}' "
                f"backend that serves model '{engine.name}'; leave them at 0",
                param="presence_penalty" if self.presence_penalty else "frequency_penalty",
            )

    def _sampling(self, engine: Engine, index: int) -> SamplingParams:
        defaults = engine.manifest.generation_defaults
        temperature = defaults.temperature if self.temperature is None else self.temperature
        seed = secrets.randbits(63) if self.seed is None else _seed_for_choice(self.seed, index)
        return SamplingParams(
            temperature=temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            seed=seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )

    def to_inference_request(self, engine: Engine, id_prefix: str, priority: int = 0) -> InferenceRequest:
        """The checked, engine-ready request; raises InvalidRequest (400) naming what is wrong."""
        self._check_supported(engine)
        prompt = self.prompt_ids(engine)
        limits = engine.manifest.limits
        if not prompt:
            raise InvalidRequest("the prompt is empty", param=self.PROMPT_PARAM)
        if len(prompt) > limits.max_input_len:
            raise ContextLengthExceeded(
                f"this model's maximum prompt length is {limits.max_input_len} tokens, "
                f"but the prompt has {len(prompt)} tokens",
                param=self.PROMPT_PARAM,
            )
        room = limits.max_seq_len - len(prompt)
        max_tokens = self.requested_max_tokens()
        if max_tokens is not None and max_tokens > room:
            raise ContextLengthExceeded(
                f"max_tokens is {max_tokens}, but this model's maximum sequence length is {limits.max_seq_len} "
                f"tokens and the prompt has {len(prompt)}, leaving room for at most {room}",
                param=self.max_tokens_param(),
            )
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
        prompt_ids = tuple(prompt)
        choices = [
            Choice(
                index=i,
                engine_request=EngineRequest(
                    id=f"{request_id}.{i}",
                    prompt_ids=prompt_ids,
                    max_new_tokens=max_tokens or room,
                    sampling=self._sampling(engine, i),
                    stop=stops,
                    priority=priority,
                    logprobs=self.wants_logprobs(),
                ),
            )
            for i in range(self.n)
        ]
        return InferenceRequest(
            id=request_id, model=engine.name, prompt_tokens=len(prompt), choices=choices, stream=self.stream
        )



class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    PROMPT_PARAM: ClassVar[str] = "messages"
    TOP_LOGPROBS_PARAM: ClassVar[str] = "top_logprobs"

    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    def top_logprobs_asked(self) -> int:
        return self.top_logprobs or 0

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def _check_supported(self, engine: Engine) -> None:
        super()._check_supported(engine)
        if self.tools or self.tool_choice not in (None, "none"):
            raise UnsupportedParameter("tool calling is not supported by this server", param="tools")
        if self.response_format and self.response_format.get("type") != "text":
            raise UnsupportedParameter("only response_format type 'text' is supported", param="response_format")

    def prompt_ids(self, engine: Engine) -> list[int]:
        return engine.prompts.encode_chat([m.as_template_input() for m in self.messages])


class CompletionRequest(_GenerationRequest):
    prompt: str | Annotated[list[int], Field(min_length=1)] | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # alternatives per token; 0: the chosen one only
    echo: bool = False

    TOP_LOGPROBS_PARAM: ClassVar[str] = "logprobs"

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def top_logprobs_asked(self) -> int:
        return self.logprobs or 0
    suffix: str | None = None
    best_of: int | None = None

    def _check_supported(self, engine: Engine) -> None:
        super()._check_supported(engine)
        if self.echo:
            raise UnsupportedParameter("echo is not supported by this server", param="echo")
        if self.suffix:
            raise UnsupportedParameter("suffix (insertion) is not supported by this server", param="suffix")
        if self.best_of not in (None, self.n):
            raise UnsupportedParameter("best_of other than n is not supported by this server", param="best_of")

    def prompt_ids(self, engine: Engine) -> list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            vocab = engine.prompts.tokenizer.get_vocab_size(with_added_tokens=True)
            if any(not 0 <= t < vocab for t in prompt):
                raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
            return list(prompt)
        text = prompt if isinstance(prompt, str) else prompt[0]
        return engine.prompts.encode_text(text)


def _field_names(*models: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for model in models for name in model.model_fields)


_FIELD_NAMES = _field_names(ChatCompletionRequest, CompletionRequest, ChatMessage, TextPart, StreamOptions)


def field_path(loc: tuple) -> str:
    """`messages[0].content` from a pydantic error location, leaving out union-member tags."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _FIELD_NAMES:
            path += f".{part}" if path else part
    return path
