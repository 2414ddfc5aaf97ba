"""The structural limits checked before a guide is compiled: what is refused, and what must still pass."""

from __future__ import annotations

import pytest

from orchestrator.errors import InvalidRequest
from orchestrator.structured.guide import Guide, json_schema_guide
from orchestrator.structured.guide_limits import MAX_GROUP_DEPTH, MAX_RULES, check_structure
from orchestrator.structured.json_depth import JSON_DEPTH
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tools import ToolDefinition, plan_tools


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_tool_whose_schema_is_as_deep_as_a_request_may_send_still_passes():
    parameters = nested_schema(JSON_DEPTH - 1)  # 64 levels of JSON text: the most a request may send
    tools = [ToolDefinition.model_validate({"type": "function", "function": {"name": "f", "parameters": parameters}})]
    check_structure(tool_call_guide(plan_tools(tools, "required", None), TOOL_FORMATS["mistral"]))
    check_structure(json_schema_guide(parameters, param="response_format"))


@pytest.mark.parametrize(
    "guide",
    [
        Guide("regex", "([a-z ]{64}\n){8}"),  # costly per step, but not deep: the cost check is the checker's
        Guide("regex", r"\(" * 100 + "[(((((]" * 10),  # escaped and bracketed parentheses are not groups
        Guide("ebnf", 'root ::= "' + "(" * 100 + '" [a-z]*'),  # nor those inside a literal
        Guide("ebnf", "\n".join(f"r{i} ::= [a-z]" for i in range(MAX_RULES - 1)) + "\nroot ::= r0"),
        Guide("regex", "(" * MAX_GROUP_DEPTH + "a" + ")" * MAX_GROUP_DEPTH),
    ],
)
def test_guides_within_the_limits_pass(guide):
    check_structure(guide)


def test_a_refusal_names_the_field_or_says_which_constraint():
    with pytest.raises(InvalidRequest, match=r"^the regex constraint nests 33 groups deep") as refused:
        check_structure(Guide("regex", "(" * 33 + ")" * 33))
    assert refused.value.param is None
