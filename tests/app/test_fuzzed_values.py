"""Values a fuzzer found the server could not serve: each is now refused with a 400 naming the field, never a
500. A repetition penalty so small that dividing a logit by it overflows, and JSON nested deep inside a field
(a past tool call's arguments as text, a schema as text or as an object, a tool's parameters). The real app
in-process over fake workers; the sampler's own arithmetic is checked in tests/llamacpp/test_sampling.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from orchestrator.engine.request import EngineRequest, SamplingParams, check_request
from orchestrator.errors import InvalidRequest
from orchestrator.structured.json_depth import JSON_DEPTH, text_depth, value_depth
from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _schema(depth: int) -> dict:
    """A JSON Schema `2 * depth + 1` levels deep: objects within objects."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _refused(catalogue, path: str, body: dict) -> tuple[int, dict]:
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.post(path, json={"model": app.model, **body})
            return response.status, (await response.json())["error"]

    return asyncio.run(go())


@pytest.mark.parametrize("value", [5e-324, 1e-30, 0.09])
def test_a_repetition_penalty_too_small_to_divide_by_is_a_400(catalogue, value):
    status, error = _refused(catalogue, "/v1/chat/completions", {"messages": HI, "repetition_penalty": value})
    assert (status, error["param"]) == (400, "repetition_penalty")


def test_the_worker_refuses_a_repetition_penalty_below_its_bound_too():
    def request(penalty: float) -> EngineRequest:
        return EngineRequest("r", (1, 2), 4, SamplingParams(repetition_penalty=penalty))

    check_request(request(0.1), vocab_size=10)
    with pytest.raises(InvalidRequest) as refused:
        check_request(request(5e-324), vocab_size=10)
    assert refused.value.param == "repetition_penalty"


def test_depths_are_measured_without_counting_brackets_inside_strings():
    assert text_depth(json.dumps(_nested(5))) == 5
    assert text_depth('{"a": "[[[[{{{{", "b": [1, [2]], "c": "\\"]]"}') == 3
    assert text_depth("not json") == 0 and value_depth("text") == 0
    assert value_depth(_nested(7)) == 7 and value_depth([[], {"a": [1]}]) == 3


def test_tool_call_arguments_nested_deep_in_the_history_are_a_400_naming_them(catalogue):
    deep = "[" * 1200 + "]" * 1200
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    status, error = _refused(catalogue, "/v1/chat/completions", {"messages": messages})
    assert (status, error["param"]) == (400, "messages[1].tool_calls[0].function.arguments")
    assert str(JSON_DEPTH) in error["message"]


def test_a_schema_nested_deep_as_text_or_as_an_object_is_a_400_naming_it(catalogue):
    text = '{"type": "object", "properties": {"a": ' * 600 + '{"type": "string"}' + "}}" * 600
    status, error = _refused(catalogue, "/v1/chat/completions",
                             {"messages": HI, "structured_outputs": {"json": text}})
    assert (status, error["param"]) == (400, "structured_outputs.json")
    wrapper = {"name": "deep", "schema": _schema(40)}
    status, error = _refused(catalogue, "/v1/chat/completions",
                             {"messages": HI, "response_format": {"type": "json_schema", "json_schema": wrapper}})
    assert (status, error["param"]) == (400, "response_format.json_schema.schema")


def test_tool_parameters_nested_deep_are_a_400_naming_them(catalogue):
    tools = [{"type": "function", "function": {"name": "f", "parameters": _schema(3)}},
             {"type": "function", "function": {"name": "g", "parameters": _schema(40)}}]
    status, error = _refused(catalogue, "/v1/chat/completions", {"messages": HI, "tools": tools})
    assert (status, error["param"]) == (400, "tools[1].function.parameters")
