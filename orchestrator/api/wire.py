"""OpenAI's request bodies as pydantic types, and their one conversion into engine requests.

Validation errors name the field; every number is bounded here to what every backend can honour (the bounds
live in engine/request.py's FIELD_BOUNDS). Anything this server cannot honour is refused with a 400 that says so,
never silently ignored. Besides OpenAI's fields, the extension fields serving peers declare are accepted
(vLLM, trtllm-serve, SGLang): ignore_eos, min_tokens, repetition_penalty, min_p, top_k, stop_token_ids,
include_stop_str_in_output, stream_options.continuous_usage_stats, chat_template_kwargs, and NVIDIA's `nvext`.
"""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.api.cache_salt import MAX_CACHE_SALT_CHARS
from orchestrator.api.engine_requests import (
    Generation,
    SamplingFields,
    chat_prompt,
    inference_request,
    system_prefix,
)
from orchestrator.api.output_plan import OutputPlan, chat_output_plan, check_output
from orchestrator.engine.catalogue import Engine
from orchestrator.engine.request import FIELD_BOUNDS, INT32_MAX
from orchestrator.errors import InvalidRequest, UnsupportedParameter
from orchestrator.lifecycle import InferenceRequest
from orchestrator.structured.guide import (
    guide_from_response_format,
    guide_from_structured_outputs,
    single_guide,
)
from orchestrator.structured.tools import ToolChoice, ToolDefinition, plan_tools

Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
StopString = Annotated[str, Field(min_length=1, max_length=FIELD_BOUNDS.stop_string_chars)]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class Wire(BaseModel):
    """A request body's part: unknown fields are refused, and nothing changes once parsed."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(Wire):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage on every chunk (vLLM's extension)


class NvExt(Wire):
    """NVIDIA's extension wrapper (aiperf, Dynamo): the same fields as at the top level."""

    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class TextPart(Wire):
    type: Literal["text"]
    text: str


class CalledFunction(Wire):
    name: str
    arguments: str  # JSON text, as OpenAI sends it back


class AssistantToolCall(Wire):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    reasoning_content: str | None = None  # an assistant turn's thinking, as reasoning models' clients send it back

    @model_validator(mode="after")
    def _fits_role(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, names the tool_call_id it answers")
        return self

    def as_template_input(self) -> dict:
        content = self.content if not isinstance(self.content, list) else "".join(p.text for p in self.content)
        message = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls is not None:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        for extra in ("tool_call_id", "name", "reasoning_content"):
            if getattr(self, extra) is not None:
                message[extra] = getattr(self, extra)
        return message


class _GenerationRequest(Wire):
    """Fields chat and text completions share."""

    PROMPT_PARAM: ClassVar[str] = "prompt"
    TOP_LOGPROBS_PARAM: ClassVar[str] = "logprobs"
    DEFAULT_MAX_TOKENS: ClassVar[int | None] = None  # without max_tokens: what the context leaves

    model: str
    max_tokens: Annotated[int, Field(ge=1, le=FIELD_BOUNDS.max_new_tokens)] | None = None
    temperature: Annotated[Finite, Field(ge=0, le=FIELD_BOUNDS.temperature)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=FIELD_BOUNDS.top_k)] | None = None  # -1 or 0: the whole vocabulary
    min_p: Annotated[Finite, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=FIELD_BOUNDS.choices)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=FIELD_BOUNDS.stop_strings)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=FIELD_BOUNDS.stop_token_ids)] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    seed: Annotated[int, Field(ge=FIELD_BOUNDS.seed_min, le=FIELD_BOUNDS.seed_max)] | None = None
    presence_penalty: Annotated[Finite, Field(ge=-FIELD_BOUNDS.penalty, le=FIELD_BOUNDS.penalty)] = 0.0
    frequency_penalty: Annotated[Finite, Field(ge=-FIELD_BOUNDS.penalty, le=FIELD_BOUNDS.penalty)] = 0.0
    repetition_penalty: Annotated[
        Finite, Field(ge=1 / FIELD_BOUNDS.repetition_penalty, le=FIELD_BOUNDS.repetition_penalty)] = 1.0
    logit_bias: Annotated[
        dict[str, Annotated[Finite, Field(ge=-FIELD_BOUNDS.logit_bias, le=FIELD_BOUNDS.logit_bias)]],
        Field(max_length=FIELD_BOUNDS.logit_bias_entries),
    ] | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None = None  # api/cache_salt.py
    user: str | None = None
    service_tier: str | None = None  # "flex" runs as batch priority, "priority" as interactive
    nvext: NvExt | None = None
    response_format: dict[str, Any] | None = None  # text | json_object | json_schema (structured/guide.py)
    structured_outputs: dict[str, Any] | None = None  # vLLM's: json | regex | choice | grammar | json_object

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.continuous_usage_stats)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_tokens"

    def prompt_ids(self, engine: Engine, plan: OutputPlan) -> list[int]:
        raise NotImplementedError

    def wants_logprobs(self) -> bool:
        raise NotImplementedError

    def top_logprobs_asked(self) -> int:
        raise NotImplementedError

    def prompt_text(self, engine: Engine) -> str | None:
        raise NotImplementedError

    def audit_prompt(self) -> object:
        raise NotImplementedError

    def system_prefix(self, engine: Engine, plan: OutputPlan, prompt: list[int]) -> int:
        """Leading prompt tokens before the first user message (conversations only)."""
        return 0

    def echo_text(self, engine: Engine, prompt: list[int]) -> str | None:
        """The prompt's text, when the response must begin with it (completions' echo)."""
        return None

    def _extension(self, name: str):
        """An extension field given at the top level or inside nvext; the two must not disagree."""
        top = getattr(self, name)
        inner = getattr(self.nvext, name) if self.nvext is not None else None
        if top is not None and inner is not None and top != inner:
            raise InvalidRequest(f"{name} and nvext.{name} disagree ({top!r} and {inner!r})", param=f"nvext.{name}")
        return top if top is not None else inner

    def output_plan(self, engine: Engine) -> OutputPlan:
        """The output constraint and parsing this request asks for (a chat request adds its tools)."""
        guide = single_guide(guide_from_response_format(self.response_format),
                             guide_from_structured_outputs(self.structured_outputs))
        return OutputPlan.for_model(engine.manifest.chat, guide, None, chat=False)

    def sampling_fields(self) -> SamplingFields:
        return SamplingFields(temperature=self.temperature, top_p=self.top_p,
                              top_k=None if self.top_k is None else max(self.top_k, 0), min_p=self.min_p,
                              seed=self.seed, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty, logit_bias=self.logit_bias,
                              ignore_eos=bool(self._extension("ignore_eos")),
                              min_tokens=self._extension("min_tokens") or 0,
                              stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
                              stop_token_ids=tuple(self.stop_token_ids or ()),
                              include_stop_str_in_output=self.include_stop_str_in_output,
                              logprobs=self.wants_logprobs(), top_logprobs=self.top_logprobs_asked(),
                              logprobs_param=self.TOP_LOGPROBS_PARAM)

    @property
    def choices_asked(self) -> int:
        return self.n

    def generation(self, engine: Engine) -> Generation:
        """This request in the server's own terms, its prompt made with the model's template and tokenizer; raises
        InvalidRequest / UnsupportedParameter (400) naming what is wrong."""
        fields = self.sampling_fields()
        plan = self.output_plan(engine)
        check_output(plan, fields, engine)
        prompt = self.prompt_ids(engine, plan)
        return Generation(
            prompt=prompt, prompt_param=self.PROMPT_PARAM, fields=fields, plan=plan,
            max_tokens=self.requested_max_tokens(), max_tokens_param=self.max_tokens_param(),
            default_max_tokens=self.DEFAULT_MAX_TOKENS, n=self.n, stream=self.stream,
            echo=self.echo_text(engine, prompt), system_prefix_tokens=self.system_prefix(engine, plan, prompt),
            cache_salt=self.cache_salt,
        )

    def to_inference_request(self, engine: Engine, id_prefix: str, priority: int = 0,
                             ceiling: int | None = None) -> InferenceRequest:
        """The checked, engine-ready request (`engine_requests.inference_request` of `generation()`)."""
        return inference_request(engine, self.generation(engine), id_prefix=id_prefix, priority=priority,
                                 ceiling=ceiling)


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=FIELD_BOUNDS.max_new_tokens)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=FIELD_BOUNDS.top_logprobs)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    PROMPT_PARAM: ClassVar[str] = "messages"
    TOP_LOGPROBS_PARAM: ClassVar[str] = "top_logprobs"
    def wants_logprobs(self) -> bool:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs set to true", param="top_logprobs")
        return bool(self.logprobs)

    def top_logprobs_asked(self) -> int:
        return self.top_logprobs or 0

    def requested_max_tokens(self) -> int | None:
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise InvalidRequest(
                f"max_tokens ({self.max_tokens}) and max_completion_tokens ({self.max_completion_tokens}) disagree; "
                "send one of them (max_tokens is the older name of max_completion_tokens)",
                param="max_completion_tokens",
            )
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def output_plan(self, engine: Engine) -> OutputPlan:
        return chat_output_plan(engine, plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls),
                                guide_from_response_format(self.response_format),
                                guide_from_structured_outputs(self.structured_outputs))

    def prompt_ids(self, engine: Engine, plan: OutputPlan) -> list[int]:
        return chat_prompt(engine, self.audit_prompt(), plan, self.chat_template_kwargs)

    def system_prefix(self, engine: Engine, plan: OutputPlan, prompt: list[int]) -> int:
        return system_prefix(engine, self.audit_prompt(), plan, self.chat_template_kwargs, prompt)

    def prompt_text(self, engine: Engine) -> str | None:
        return engine.prompts.render_chat(self.audit_prompt(), self.chat_template_kwargs or {})

    def audit_prompt(self) -> list[dict]:
        return [m.as_template_input() for m in self.messages]


class CompletionRequest(_GenerationRequest):
    prompt: str | Annotated[list[TokenId], Field(min_length=1)] | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # alternatives per token; 0: the chosen one only
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=FIELD_BOUNDS.choices)] | None = None

    DEFAULT_MAX_TOKENS: ClassVar[int | None] = COMPLETIONS_DEFAULT_MAX_TOKENS

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def top_logprobs_asked(self) -> int:
        return self.logprobs or 0

    def generation(self, engine: Engine) -> Generation:
        if self.echo and self.logprobs is not None:
            raise UnsupportedParameter(
                "echo with logprobs needs the prompt's log probabilities, which this server does not compute; "
                "leave out logprobs or echo",
                param="echo",
            )
        if self.suffix:
            raise UnsupportedParameter("suffix (insertion) is not supported by this server", param="suffix")
        if self.best_of not in (None, self.n):
            raise UnsupportedParameter("best_of other than n is not supported by this server", param="best_of")
        return super().generation(engine)

    def prompt_ids(self, engine: Engine, plan: OutputPlan) -> list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            vocab = engine.prompts.tokenizer.get_vocab_size(with_added_tokens=True)
            if any(not 0 <= t < vocab for t in prompt):
                raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
            return list(prompt)
        text = prompt if isinstance(prompt, str) else prompt[0]
        return engine.prompts.encode_text(text)

    def prompt_text(self, engine: Engine) -> str | None:
        text = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return text if isinstance(text, str) else None  # token ids are counted as they are

    def audit_prompt(self) -> object:
        return self.prompt

    def echo_text(self, engine: Engine, prompt: list[int]) -> str | None:
        if not self.echo:
            return None
        if isinstance(self.prompt, str):
            return self.prompt
        if isinstance(self.prompt[0], str):
            return self.prompt[0]
        return engine.prompts.tokenizer.decode(prompt, skip_special_tokens=False)


@functools.cache
def field_names(model: type[BaseModel]) -> frozenset[str]:
    """Every field name a body of type `model` can hold, at any depth (nested models, lists, unions)."""
    names: set[str] = set()
    seen: set[type] = set()

    def walk(annotation) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                return
            seen.add(annotation)
            for name, info in annotation.model_fields.items():
                names.add(info.alias or name)
                walk(info.annotation)
                for meta in info.metadata:
                    walk(meta)
        for arg in typing.get_args(annotation):
            walk(arg)

    walk(model)
    return frozenset(names)


def field_path(loc: tuple, model: type[BaseModel]) -> str:
    """`messages[0].content` from a pydantic error location in a `model` body, leaving out union-member tags."""
    known = field_names(model)
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in known:
            path += f".{part}" if path else part
    return path
