"""OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` as wire types, and what they ask of generation.

`plan_tools` checks them together (names unique, a named choice among the tools, no tool_choice without
tools) and returns a ToolPlan: which tools the model may call, in which mode, and whether several calls
may come in one answer. The plan's guide (`tool_grammar.py`) is what enforces `required` and a named
choice; `auto` lets the model choose and the parser (`tool_parsers.py`) tells calls from text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import InvalidRequest
from orchestrator.structured.json_depth import check_depth

MAX_TOOLS = 128  # OpenAI's limit
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
ToolMode = Literal["none", "auto", "required", "named"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionDefinition(_Wire):
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object; none means no arguments
    strict: bool | None = None  # arguments always follow the schema when a call is forced, strict or not

    def parameters_schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else EMPTY_PARAMETERS


class ToolDefinition(_Wire):
    type: Literal["function"]
    function: FunctionDefinition

    def template_input(self) -> dict[str, Any]:
        """The shape Hugging Face chat templates read from `tools`."""
        return self.model_dump(exclude_none=True)


class FunctionName(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools ask of generation.

    `tools`: those the model may call (a named choice: only that one); `mode`: none (tools listed, no
    call allowed), auto (the model chooses), required (one or more calls), named (exactly one call of
    that function); `parallel`: several calls allowed in one answer (never for a named choice).
    """

    tools: tuple[ToolDefinition, ...]
    mode: ToolMode
    parallel: bool

    @property
    def forced(self) -> bool:
        """The output must be tool calls, enforced by a grammar."""
        return self.mode in ("required", "named")

    @property
    def parses_calls(self) -> bool:
        return self.mode != "none"


def plan_tools(tools: list[ToolDefinition] | None, tool_choice: ToolChoice | None,
               parallel_tool_calls: bool | None) -> ToolPlan | None:
    """The plan for a request, or None when it has no tools. OpenAI's defaults: tool_choice `auto` with
    tools, parallel calls allowed."""
    if not tools:
        if tools is not None:
            raise InvalidRequest("tools must list at least one tool (or be left out)", param="tools")
        if tool_choice is not None and tool_choice != "none":
            raise InvalidRequest(f"tool_choice {_show(tool_choice)} needs tools", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"tools lists {len(tools)} tools; the limit is {MAX_TOOLS}", param="tools")
    names = [tool.function.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InvalidRequest(
            f"tools must have distinct names; repeated: {', '.join(duplicates)}", param="tools"
        )
    for i, tool in enumerate(tools):
        check_depth(tool.function.parameters_schema(), f"tools[{i}].function.parameters")
    parallel = parallel_tool_calls is not False
    choice = tool_choice if tool_choice is not None else "auto"
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in names:
            raise InvalidRequest(
                f"tool_choice names function {name!r}, which is not among the tools ({', '.join(names)})",
                param="tool_choice.function.name",
            )
        return ToolPlan((tools[names.index(name)],), "named", False)
    return ToolPlan(tuple(tools), choice, parallel)


def _show(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return json.dumps(value)
