"""tools, tool_choice and parallel_tool_calls: wire types and the plan they make together."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from orchestrator.errors import InvalidRequest
from orchestrator.structured.tools import MAX_TOOLS, ToolChoice, ToolDefinition, plan_tools


def tool(name: str, **function) -> ToolDefinition:
    return ToolDefinition.model_validate({"type": "function", "function": {"name": name, **function}})


CHOICE = TypeAdapter(ToolChoice)
TOOLS = [
    tool("get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}),
    tool("ping"),
]


def test_openai_defaults_are_auto_with_parallel_calls():
    plan = plan_tools(TOOLS, None, None)
    assert (plan.mode, plan.parallel, plan.forced, plan.tools) == ("auto", True, False, tuple(TOOLS))


def test_required_forces_calls_and_honours_parallel_tool_calls():
    assert plan_tools(TOOLS, CHOICE.validate_python("required"), None).parallel is True
    plan = plan_tools(TOOLS, CHOICE.validate_python("required"), False)
    assert (plan.mode, plan.forced, plan.parallel) == ("required", True, False)


def test_a_named_choice_keeps_only_that_tool_and_one_call():
    choice = CHOICE.validate_python({"type": "function", "function": {"name": "ping"}})
    plan = plan_tools(TOOLS, choice, True)
    assert (plan.mode, plan.forced, plan.parallel, plan.tools) == ("named", True, False, (TOOLS[1],))


def test_none_lists_tools_but_parses_no_calls():
    plan = plan_tools(TOOLS, "none", None)
    assert (plan.mode, plan.forced, plan.parses_calls) == ("none", False, False)
    assert plan_tools(None, "none", None) is None
    assert plan_tools(None, None, False) is None


def test_a_tool_without_parameters_takes_an_empty_object():
    assert TOOLS[1].function.parameters_schema() == {"type": "object", "properties": {}}
    assert TOOLS[1].template_input() == {"type": "function", "function": {"name": "ping"}}


@pytest.mark.parametrize(
    ("tools", "choice", "param", "words"),
    [
        (None, "required", "tool_choice", "needs tools"),
        (None, {"type": "function", "function": {"name": "x"}}, "tool_choice", "needs tools"),
        ([], None, "tools", "at least one"),
        ([tool("a"), tool("a")], None, "tools", "repeated: a"),
        (
            TOOLS,
            {"type": "function", "function": {"name": "launch"}},
            "tool_choice.function.name",
            "not among",
        ),
        ([tool(f"t{i}") for i in range(MAX_TOOLS + 1)], None, "tools", f"the limit is {MAX_TOOLS}"),
    ],
)
def test_inconsistent_tool_requests_are_refused_naming_the_field(tools, choice, param, words):
    with pytest.raises(InvalidRequest) as refused:
        plan_tools(tools, None if choice is None else CHOICE.validate_python(choice), None)
    assert refused.value.param == param
    assert words in refused.value.message


@pytest.mark.parametrize(
    "body",
    [
        {"type": "function", "function": {"name": "has space"}},
        {"type": "retrieval", "function": {"name": "a"}},
        {"type": "function", "function": {"name": "a", "parameters": "not an object"}},
        {"type": "function", "function": {"name": "a", "unknown": 1}},
    ],
)
def test_malformed_tools_fail_validation(body):
    with pytest.raises(ValidationError):
        ToolDefinition.model_validate(body)


def test_tool_choice_accepts_only_openais_shapes():
    for value in ("none", "auto", "required"):
        assert CHOICE.validate_python(value) == value
    for value in ("any", {"type": "function"}, {"type": "function", "function": {}}):
        with pytest.raises(ValidationError):
            CHOICE.validate_python(value)
