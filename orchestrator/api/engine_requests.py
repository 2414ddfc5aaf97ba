"""From a front door's `Generation` to engine requests: defaults, limits, and what the model's backend honours.

Every wire format shares all of it; a wire type (api/wire.py) only says how it spells its fields and makes its
prompt, in its `generation()`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.backends import features_of
from orchestrator.engine.catalogue import Engine
from orchestrator.engine.request import EngineRequest, SamplingParams
from orchestrator.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter
from orchestrator.lifecycle import Choice, InferenceRequest
from orchestrator.structured.tool_formats import tool_format
from orchestrator.structured.tool_prompt import prompt_messages, template_supports_tools
from orchestrator.text.chat_template import TemplateError

if TYPE_CHECKING:
    from orchestrator.api.output_plan import OutputPlan


@dataclass(frozen=True)
class SamplingFields:
    """What a request says about sampling and about how its sequences end, before the model's defaults. What a
    wire format has no field for takes its neutral value."""

    temperature: float | None
    top_p: float | None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    logprobs_param: str = "top_logprobs"  # how the request spells the number of alternatives: top_logprobs | logprobs


def check_supported(fields: SamplingFields, engine: Engine) -> None:
    """Refuse, naming the field, anything the model's backend cannot honour; neutral values always pass."""
    features, backend = features_of(engine.manifest), engine.manifest.backend
    where = f"the '{backend}' backend that serves model '{engine.name}'"
    wanted = [
        ("logprobs", fields.logprobs and not features.logprobs, "log probabilities"),
        (fields.logprobs_param, fields.top_logprobs > 0 and not features.top_logprobs,
         "alternative tokens' log probabilities" + (f" ({features.top_logprobs_note})" if features.top_logprobs_note else "")),
        ("logit_bias", bool(fields.logit_bias) and not features.logit_bias, "logit_bias"),
        ("min_p", bool(fields.min_p) and not features.min_p, "min_p"),
        ("presence_penalty", fields.presence_penalty != 0 and not features.penalties, "presence_penalty"),
        ("frequency_penalty", fields.frequency_penalty != 0 and not features.penalties, "frequency_penalty"),
        ("repetition_penalty", fields.repetition_penalty != 1 and not features.penalties, "repetition_penalty"),
    ]
    for param, refused, what in wanted:
        if refused:
            raise UnsupportedParameter(f"{what} is not supported by {where}", param=param)


def _logit_bias(fields: SamplingFields, vocab_size: int) -> tuple[tuple[int, float], ...]:
    bias = []
    for key, value in (fields.logit_bias or {}).items():
        token = int(key) if key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"logit_bias keys must be token ids in [0, {vocab_size}) written as strings (got {key!r:.40})",
                param="logit_bias",
            )
        bias.append((token, float(value)))
    return tuple(sorted(bias))


def _sampling(fields: SamplingFields, engine: Engine, index: int, bias: tuple) -> SamplingParams:
    defaults = engine.manifest.generation_defaults
    # A given seed: each choice draws from its own seed, made from it and the choice's index.
    seed = secrets.randbits(63) if fields.seed is None else (fields.seed * 1_000_003 + index) & 0x7FFFFFFFFFFFFFFF
    return SamplingParams(
        temperature=defaults.temperature if fields.temperature is None else fields.temperature,
        top_p=defaults.top_p if fields.top_p is None else fields.top_p,
        top_k=defaults.top_k if fields.top_k is None else fields.top_k,
        seed=seed,
        presence_penalty=fields.presence_penalty,
        frequency_penalty=fields.frequency_penalty,
        repetition_penalty=fields.repetition_penalty,
        min_p=fields.min_p or 0.0,
        logit_bias=bias,
    )


@dataclass(frozen=True)
class Generation:
    """A generation request in the server's own terms, whatever API it came through: what each front door (chat
    completions, completions, and any other wire format) makes from its wire request, and what the one
    preparation path (`inference_request`) turns into engine requests. The prompt is already tokenised by the
    front door, through the model's own template and tokenizer."""

    prompt: list[int]
    prompt_param: str  # how the wire format names its prompt (messages, prompt, input...)
    fields: SamplingFields
    plan: OutputPlan
    max_tokens: int | None  # what the request asked for; None when it did not say
    max_tokens_param: str  # how the wire format spells it
    default_max_tokens: int | None  # the API's own default when not asked (completions: 16); None: what is left
    n: int
    stream: bool
    echo: str | None = None  # completions' echo: the prompt's text, put before the answer
    system_prefix_tokens: int = 0  # a conversation's leading tokens before its first user message (system_prefix)
    cache_salt: str | None = None  # the request's own prefix cache salt (api/cache_salt.py); None: its key's


def chat_prompt(engine: Engine, messages: list[dict], plan: OutputPlan, template_kwargs: dict | None,
                add_generation_prompt: bool = True) -> list[int]:
    """The prompt of a conversation, whatever API it came through: messages in the chat template's shape (tool
    calls and results included; the tools shown by the template where it reads them, else in a system prompt in
    the model's tool call format), rendered by the model's template and tokenised."""
    fmt = tool_format(engine.manifest.chat.tool_call_format)
    shaped = prompt_messages(messages, plan.tools, fmt,
                             template_reads_tools=template_supports_tools(engine.prompts.chat_template))
    return engine.prompts.encode_chat(shaped.messages, template_kwargs or {}, add_generation_prompt,
                                      tools=shaped.tools, specials_in_content=engine.special_tokens_in_content)


def system_prefix(engine: Engine, messages: list[dict], plan: OutputPlan, template_kwargs: dict | None,
                  prompt: list[int]) -> int:
    """How many leading tokens of a conversation's `prompt` come before its first user message: the system prompt
    and the tool definitions, which every turn of an agent's conversation sends again. Computed only for models
    that keep them longer in their KV cache (the model's retain_system_prompt, on a backend with
    Features.retention), as the tokens `prompt` shares with the rendering of those leading messages alone: one more
    rendering of the system prompt and tools per request. 0 when there are none, or when the template will not
    render them alone."""
    if not (engine.retain_system_prompt and features_of(engine.manifest).retention):
        return 0
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))
    if first_user == 0 and not (plan.tools and plan.tools.tools):
        return 0
    try:
        leading = chat_prompt(engine, messages[:first_user], plan, template_kwargs, add_generation_prompt=False)
    except TemplateError:
        return 0
    shared = 0
    for ours, theirs in zip(leading, prompt, strict=False):
        if ours != theirs:
            break
        shared += 1
    return shared


def max_new_tokens(engine: Engine, generation: Generation, ceiling: int | None) -> int:
    """How many tokens each choice may generate, decided here only: what the request asked for (refused above the
    model's ceiling from models.toml, or beyond the room its context leaves), else the API's default, else what
    the context leaves; without an explicit ask the ceiling caps it. min_tokens must fit in it."""
    limits, prompt, asked = engine.manifest.limits, generation.prompt, generation.max_tokens
    param = generation.max_tokens_param
    if asked is not None and ceiling is not None and asked > ceiling:
        raise InvalidRequest(f"{param} is {asked}, more than this model allows ({ceiling} tokens per choice)",
                             param=param)
    if not prompt:
        raise InvalidRequest("the prompt is empty", param=generation.prompt_param)
    if len(prompt) > limits.max_input_len:
        raise ContextLengthExceeded(
            f"this model's maximum prompt length is {limits.max_input_len} tokens, "
            f"but the prompt has {len(prompt)} tokens",
            param=generation.prompt_param,
        )
    room = limits.max_seq_len - len(prompt)
    wanted = asked if asked is not None else generation.default_max_tokens
    if wanted is not None and wanted > room:
        raise ContextLengthExceeded(
            f"{param} is {wanted}, but this model's maximum sequence length is {limits.max_seq_len} "
            f"tokens and the prompt has {len(prompt)}, leaving room for at most {room}",
            param=param,
        )
    max_new = room if wanted is None else wanted
    capped = asked is None and ceiling is not None and ceiling < max_new
    if capped:
        max_new = ceiling
    min_tokens = generation.fields.min_tokens
    if min_tokens > max_new:
        limit = "this model allows" if capped else "the request may generate"
        raise InvalidRequest(f"min_tokens is {min_tokens}, more than {limit} ({max_new} tokens per choice)",
                             param="min_tokens")
    return max_new


def inference_request(
    engine: Engine, generation: Generation, *, id_prefix: str, priority: int = 0, ceiling: int | None = None,
    salt: str = "",
) -> InferenceRequest:
    """The checked, engine-ready request: one engine request per choice, each with the prefix cache `salt`;
    raises the taxonomy's 400s naming the field."""
    fields, plan = generation.fields, generation.plan
    max_new = max_new_tokens(engine, generation, ceiling)
    if fields.top_logprobs and engine.logits_pool is not None:  # the pinned host buffers its logits take
        engine.logits_pool.check_fits(max_new, generation.n, generation.max_tokens_param,
                                      asked=generation.max_tokens is not None)
    vocab_size = engine.prompts.tokenizer.get_vocab_size(with_added_tokens=True)
    outside = [t for t in fields.stop_token_ids if t >= vocab_size]
    if outside:
        raise InvalidRequest(f"stop_token_ids must be in [0, {vocab_size}) (got {outside[0]})", param="stop_token_ids")
    bias = _logit_bias(fields, vocab_size)
    response_id = f"{id_prefix}-{secrets.token_hex(16)}"
    prompt_ids = tuple(generation.prompt)
    choices = [
        Choice(
            index=i,
            engine_request=EngineRequest(id=f"{response_id}.{i}", prompt_ids=prompt_ids,
                                         max_new_tokens=max_new, sampling=_sampling(fields, engine, i, bias),
                                         stop=fields.stop, stop_token_ids=fields.stop_token_ids,
                                         ignore_eos=fields.ignore_eos, min_tokens=fields.min_tokens,
                                         include_stop_str_in_output=fields.include_stop_str_in_output,
                                         priority=priority, logprobs=fields.logprobs,
                                         top_logprobs=fields.top_logprobs, guide=plan.guide,
                                         tool_calls=plan.tool_calls, reasoning=plan.reasoning,
                                         system_prefix_tokens=generation.system_prefix_tokens,
                                         cache_salt=salt),
        )
        for i in range(generation.n)
    ]
    return InferenceRequest(
        id=response_id, model=engine.name, prompt_tokens=len(prompt_ids), choices=choices, stream=generation.stream,
        echo=generation.echo, guide=plan.guide,
    )
