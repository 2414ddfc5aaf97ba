"""The bodies of `POST /v1/messages` and `POST /v1/messages/count_tokens` as pydantic types, and their one
conversion into the server's `Generation` (the prompt through conversation.py and the model's chat template, as
chat completions makes it).

Every top-level field of Anthropic's (beta) request is named here: honoured, or accepted and ignored where it has
no meaning on this server (documented in docs/api.md); a field Anthropic does not define is refused,
naming it, as Anthropic does. `max_tokens` is required, as Anthropic requires it, and is the most the answer may
take: beyond the room the prompt leaves in the context, or the model's ceiling, it is that room (Claude Code asks
for 32000 whatever the model).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from orchestrator.api.cache_salt import MAX_CACHE_SALT_CHARS
from orchestrator.api.engine_requests import Generation, SamplingFields, chat_prompt, system_prefix
from orchestrator.api.messages_api.blocks import MessageParam, TextBlock
from orchestrator.api.messages_api.conversation import chat_messages
from orchestrator.api.output_plan import OutputPlan, chat_output_plan, check_output
from orchestrator.api.wire import Finite, StopString, Wire
from orchestrator.engine.catalogue import Engine
from orchestrator.engine.request import FIELD_BOUNDS
from orchestrator.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter
from orchestrator.structured.tools import (
    FUNCTION_NAME_PATTERN,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    ToolDefinition,
    plan_tools,
)
from orchestrator.structured.tools import ToolChoice as ChatToolChoice


class _Lenient(BaseModel):
    """An object whose fields beyond the typed ones are Anthropic's hints, accepted and ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class CustomTool(_Lenient):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
    description: str | None = None
    input_schema: dict[str, Any]

    def definition(self) -> ToolDefinition:
        """The chat completions shape of this tool."""
        function = FunctionDefinition(name=self.name, description=self.description, parameters=self.input_schema)
        return ToolDefinition(type="function", function=function)


class ServerTool(_Lenient):
    """One of Anthropic's server tools (web_search_*, bash_*, text_editor_*, computer_*...): refused."""

    type: str


def _tool_kind(value: Any) -> str | None:
    """A tool's kind by its type (none or "custom": a custom tool); None for a value that is not an object, which
    validation refuses naming the field."""
    if isinstance(value, dict):
        kind = value.get("type")
    elif isinstance(value, BaseModel):
        kind = getattr(value, "type", None)
    else:
        return None
    return "custom" if kind in (None, "custom") else "server"


Tool = Annotated[Annotated[CustomTool, Tag("custom")] | Annotated[ServerTool, Tag("server")], Discriminator(_tool_kind)]


class ToolChoice(Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Field(ge=0)] | None = None


class Metadata(_Lenient):
    user_id: str | None = None


class CountTokensRequest(Wire):
    """The body of `POST /v1/messages/count_tokens`: the prompt part of a Messages request."""

    PROMPT_PARAM: ClassVar[str] = "messages"

    model: str
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    # Accepted and ignored: Anthropic's platform features (caching hints, context editing, effort, MCP servers,
    # speed, billing, structured output in beta) that have no meaning for a model served here (docs/api.md).
    cache_control: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None
    compaction: dict[str, Any] | None = None
    speed: str | None = None
    billing_policy: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None

    def template_messages(self) -> list[dict]:
        return chat_messages(self.system, self.messages)

    def output_plan(self, engine: Engine) -> OutputPlan:
        tools = self.custom_tools()
        choice, parallel = self.chat_tool_choice()
        return chat_output_plan(engine, plan_tools(tools, choice if tools else None, parallel))

    def chat_tool_choice(self) -> tuple[ChatToolChoice | None, bool | None]:
        """tool_choice as chat's `tool_choice` and `parallel_tool_calls`: auto, any (required), tool (named), none."""
        choice = self.tool_choice
        if choice is None:
            return None, None
        parallel = None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequest("tool_choice.name is required when tool_choice.type is 'tool'",
                                     param="tool_choice.name")
            return NamedToolChoice(type="function", function=FunctionName(name=choice.name)), parallel
        return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel

    def custom_tools(self) -> list[ToolDefinition] | None:
        """The tools in chat completions' shape (none for an empty list); a server tool is refused, naming it."""
        for i, tool in enumerate(self.tools or ()):
            if isinstance(tool, ServerTool):
                raise UnsupportedParameter(
                    f"tools[{i}].type {tool.type!r}: Anthropic's server tools are not supported by this server; "
                    "it serves custom tools (name, description, input_schema) only", param=f"tools[{i}].type")
        return [tool.definition() for tool in self.tools] if self.tools else None

    def prompt_ids(self, engine: Engine) -> list[int]:
        """The prompt exactly as a generation of this conversation would make it (tools included)."""
        return chat_prompt(engine, self.template_messages(), self.output_plan(engine), None)


class MessagesRequest(CountTokensRequest):
    """The body of `POST /v1/messages` (one answer: the API has no `n`)."""

    choices_asked: ClassVar[int] = 1  # one message per request

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[StopString], Field(max_length=FIELD_BOUNDS.stop_strings)] | None = None
    temperature: Annotated[Finite, Field(ge=0, le=FIELD_BOUNDS.temperature)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0, le=FIELD_BOUNDS.top_k)] | None = None
    metadata: Metadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None = None  # api/cache_salt.py
    # Accepted and ignored, as above: containers, diagnostics, routing and fallbacks.
    container: Any = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    fallbacks: Any = None
    fallback_credit_token: Any = None
    thread: Any = None

    @field_validator("service_tier")
    @classmethod
    def _one_tier(cls, tier: str | None) -> str | None:
        """Anthropic's `standard_only` is this server's default class, as `auto` is."""
        return None if tier == "standard_only" else tier

    # -- FrontDoorRequest ---------------------------------------------------------------------------------------
    def generation(self, engine: Engine) -> Generation:
        """This request in the server's own terms; raises InvalidRequest / UnsupportedParameter (400) naming the
        field, ContextLengthExceeded when the prompt does not fit (Anthropic's words: "prompt is too long")."""
        fields = self.sampling_fields()
        plan = self.output_plan(engine)
        check_output(plan, fields, engine)
        messages = self.template_messages()
        prompt = chat_prompt(engine, messages, plan, None)
        limits = engine.manifest.limits
        if len(prompt) > limits.max_input_len:
            raise ContextLengthExceeded(
                f"prompt is too long: {len(prompt)} tokens > {limits.max_input_len} maximum (messages, system "
                "and tools together)", param=self.PROMPT_PARAM)
        room = max(limits.max_seq_len - len(prompt), 1)
        return Generation(prompt=prompt, prompt_param=self.PROMPT_PARAM, fields=fields, plan=plan,
                          max_tokens=None, max_tokens_param="max_tokens",
                          default_max_tokens=min(self.max_tokens, room), n=1, stream=self.stream,
                          system_prefix_tokens=system_prefix(engine, messages, plan, None, prompt),
                          cache_salt=self.cache_salt)

    def prompt_text(self, engine: Engine) -> str | None:
        return engine.prompts.render_chat(self.template_messages(), {})

    def audit_prompt(self) -> list[dict]:
        return self.template_messages()

    def sampling_fields(self) -> SamplingFields:
        """Stop strings are kept at the end of the engine's text (include_stop_str_in_output), so the presenter
        can tell which one ended the answer; it takes it off again (output.py)."""
        return SamplingFields(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              stop=tuple(self.stop_sequences or ()), include_stop_str_in_output=bool(self.stop_sequences))
