"""The body of `POST /v1/responses` as pydantic types, and its one conversion into the server's `Generation`.

Every field OpenAI's Responses API defines for a stateless request is either honoured or accepted with a documented
reason it has no effect here (docs/api.md, "Responses API"); the fields that need the response store
(`store`, `previous_response_id`, `background`) are served by routes.py and stored.py. Input items become a chat conversation
(conversation.py) rendered by the model's chat template, exactly as chat completions renders its messages.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from orchestrator.api.cache_salt import MAX_CACHE_SALT_CHARS
from orchestrator.api.engine_requests import Generation, SamplingFields, chat_prompt, system_prefix
from orchestrator.api.output_plan import OutputPlan, chat_output_plan, check_output
from orchestrator.api.responses_api.conversation import chat_messages
from orchestrator.api.responses_api.items import InputItem, MessageItem, item_kind, text_or
from orchestrator.api.wire import Finite, Wire
from orchestrator.backends import features_of
from orchestrator.engine.catalogue import Engine
from orchestrator.engine.request import FIELD_BOUNDS
from orchestrator.errors import InvalidRequest, UnsupportedParameter
from orchestrator.structured.guide import Guide, json_schema_guide
from orchestrator.structured.tools import (
    FUNCTION_NAME_PATTERN,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    ToolDefinition,
    plan_tools,
)

_ITEMS = TypeAdapter(list[InputItem])
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# What OpenAI lets `include` ask for. Only the logprobs are produced here; the others name items this server never
# makes (hosted tools' results, input images) or content it does not encrypt, so there is nothing to add.
Includable = Literal[
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url", "code_interpreter_call.outputs",
    "reasoning.encrypted_content", "message.output_text.logprobs",
]
# Tool types Codex CLI lists by default besides its function tools: accepted, and not offered to the model (it has
# no such tools here; a function tool of the same purpose is what it can call).
IGNORED_TOOL_TYPES = frozenset({"local_shell", "custom", "web_search", "web_search_preview"})


# -- tools, tool_choice, text -----------------------------------------------------------------------------------
class FunctionTool(Wire):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def definition(self) -> ToolDefinition:
        """The chat completions shape of this tool (nested under `function`)."""
        function = FunctionDefinition(name=self.name, description=self.description, parameters=self.parameters,
                                      strict=self.strict)
        return ToolDefinition(type="function", function=function)


class OtherTool(BaseModel):
    """A tool of another type than function: checked against IGNORED_TOOL_TYPES by the request."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str


def _tool_kind(value: Any) -> str:
    kind = item_kind(value)
    return f"<{kind if kind in ('function', 'namespace') else 'other'}>"


NamespacedTool = Annotated[Annotated[FunctionTool, Tag("<function>")] | Annotated[OtherTool, Tag("<other>")],
                           Discriminator(_tool_kind)]


class NamespaceTool(Wire):
    """A named group of function tools (Codex sends its agent tools so): its functions are offered like any
    other, and a call of one names the namespace."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[NamespacedTool]


Tool = Annotated[
    Annotated[FunctionTool, Tag("<function>")] | Annotated[NamespaceTool, Tag("<namespace>")]
    | Annotated[OtherTool, Tag("<other>")],
    Discriminator(_tool_kind),
]


class FunctionChoice(Wire):
    type: Literal["function"]
    name: str


class TextFormat(Wire):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def guide(self) -> Guide | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Guide("json_object", param="text.format")
        if self.name is None:
            raise InvalidRequest("text.format.name is required for a json_schema format", param="text.format.name")
        if self.schema_ is None:
            raise InvalidRequest("text.format.schema is required: the JSON Schema the output must follow",
                                 param="text.format.schema")
        return json_schema_guide(self.schema_, param="text.format.schema")


class TextConfig(Wire):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # no model here has a setting for it


class ReasoningConfig(Wire):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(Wire):
    include_obfuscation: bool | None = None  # no padding is added to events here


# -- the request ------------------------------------------------------------------------------------------------
class ResponsesRequest(Wire):
    """The body of `POST /v1/responses` (one answer: the API has no `n`)."""

    PROMPT_PARAM: ClassVar[str] = "input"
    choices_asked: ClassVar[int] = 1  # one output per response

    model: str
    input: text_or(list[InputItem])
    instructions: str | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=FIELD_BOUNDS.max_new_tokens)] | None = None
    temperature: Annotated[Finite, Field(ge=0, le=FIELD_BOUNDS.temperature)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=FIELD_BOUNDS.top_logprobs)] | None = None
    include: list[Includable] | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None = None  # api/cache_salt.py
    prompt_cache_key: str | None = None  # the prefix cache needs no key: a repeated prefix is found by its tokens
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    client_metadata: dict[str, Any] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None

    # -- FrontDoorRequest ---------------------------------------------------------------------------------------
    def generation(self, engine: Engine) -> Generation:
        """This request in the server's own terms, its conversation rendered by the model's template; raises
        InvalidRequest / UnsupportedParameter (400) naming the field."""
        self._check_fields()
        fields = self.sampling_fields()
        if fields.logprobs and not features_of(engine.manifest).logprobs:
            raise UnsupportedParameter(
                f"include {LOGPROBS_INCLUDE!r}: log probabilities are not supported by the "
                f"'{engine.manifest.backend}' backend that serves model '{engine.name}'", param="include")
        plan = self.output_plan(engine)
        check_output(plan, fields, engine)
        messages = self.audit_prompt()
        prompt = chat_prompt(engine, messages, plan, None)
        return Generation(prompt=prompt, prompt_param=self.PROMPT_PARAM, fields=fields, plan=plan,
                          max_tokens=self.max_output_tokens, max_tokens_param="max_output_tokens",
                          default_max_tokens=None, n=1, stream=self.stream,
                          system_prefix_tokens=system_prefix(engine, messages, plan, None, prompt),
                          cache_salt=self.cache_salt)

    def prompt_text(self, engine: Engine) -> str | None:
        return engine.prompts.render_chat(self.audit_prompt(), {})

    def audit_prompt(self) -> list[dict]:
        """The conversation as chat-template messages (instructions first, as a system message)."""
        return chat_messages(self.instructions, self.input_items())

    # -- the rest -----------------------------------------------------------------------------------------------
    def input_items(self) -> list[BaseModel]:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def continuing(self, history: list[dict]) -> ResponsesRequest:
        """This request after the conversation it continues (the kept items of `previous_response_id`)."""
        return self.model_copy(update={"input": _ITEMS.validate_python(history) + self.input_items()})

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    def _check_fields(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
        if not self.input:
            raise InvalidRequest("input must hold at least one item", param="input")

    def sampling_fields(self) -> SamplingFields:
        if self.top_logprobs and not self.wants_logprobs:
            raise InvalidRequest(f"top_logprobs needs include to list {LOGPROBS_INCLUDE!r}", param="top_logprobs")
        return SamplingFields(temperature=self.temperature, top_p=self.top_p, logprobs=self.wants_logprobs,
                              top_logprobs=self.top_logprobs or 0)

    def function_tools(self) -> list[ToolDefinition] | None:
        """The function tools, those of namespaces included, in chat completions' shape; another tool type is
        refused unless Codex sends it by default (IGNORED_TOOL_TYPES: accepted, not offered to the model)."""
        if self.tools is None:
            return None
        functions = [tool.definition() for _, tool in self._functions()]
        return functions if functions or not self.tools else None

    def namespaces(self) -> dict[str, str]:
        """The namespace of each function tool that is in one, by the function's name."""
        return {tool.name: namespace for namespace, tool in self._functions() if namespace is not None}

    def _functions(self) -> list[tuple[str | None, FunctionTool]]:
        found = []
        for i, tool in enumerate(self.tools or ()):
            inner = [(tool.name, f"tools[{i}].tools[{j}]", t) for j, t in enumerate(tool.tools)] if isinstance(
                tool, NamespaceTool) else [(None, f"tools[{i}]", tool)]
            for namespace, where, each in inner:
                if isinstance(each, FunctionTool):
                    found.append((namespace, each))
                elif each.type not in IGNORED_TOOL_TYPES:
                    raise UnsupportedParameter(
                        f"{where}.type {each.type!r} is not supported by this server: it serves function tools only",
                        param=f"{where}.type")
        return found

    def output_plan(self, engine: Engine) -> OutputPlan:
        tools = self.function_tools()
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            names = [tool.function.name for tool in tools or ()]
            if choice.name not in names:
                raise InvalidRequest(f"tool_choice names function {choice.name!r}, which is not among the function "
                                     f"tools ({', '.join(names) or 'none'})", param="tool_choice.name")
            choice = NamedToolChoice(type="function", function=FunctionName(name=choice.name))
        elif tools is None and choice == "auto":
            choice = None  # Codex sends auto with only hosted tools, which are not offered
        text_format = self.text.format if self.text is not None else None
        return chat_output_plan(engine, plan_tools(tools, choice, self.parallel_tool_calls),
                                text_format.guide() if text_format is not None else None)
