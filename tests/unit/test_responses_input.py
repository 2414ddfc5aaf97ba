"""The Responses API's request body: its input items as the chat conversation chat completions would make, its
tools in chat's shape, and what it refuses by field (no model, no server)."""

from __future__ import annotations

import orjson
import pytest

from orchestrator.api.http import validate
from orchestrator.api.responses_api.wire import ResponsesRequest
from orchestrator.api.wire import ChatCompletionRequest
from orchestrator.errors import InvalidRequest, UnsupportedParameter

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def request(**fields) -> ResponsesRequest:
    return validate(orjson.dumps({"model": "m", **fields}), ResponsesRequest)


def refused(**fields) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        wire = request(**fields)
        wire._check_fields()
        wire.sampling_fields()
        wire.function_tools()
    return caught.value


def chat_messages_of(messages: list[dict]) -> list[dict]:
    """The template input chat completions makes of the same conversation: the reference."""
    return validate(orjson.dumps({"model": "m", "messages": messages}), ChatCompletionRequest).audit_prompt()


def test_a_string_input_is_one_user_message_after_the_instructions():
    assert request(input="hi", instructions="Be brief.").audit_prompt() == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_messages_with_and_without_type_and_text_parts_are_chat_messages():
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."},
                                                             {"type": "input_text", "text": " More."}]},
        {"role": "user", "content": "Hello"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]},
        {"role": "system", "content": "Stay polite."},
    ]
    assert request(input=items).audit_prompt() == chat_messages_of([
        {"role": "developer", "content": "Rules. More."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"}, {"role": "system", "content": "Stay polite."}])


def test_function_calls_join_one_assistant_turn_and_their_outputs_are_tool_messages():
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Two cities."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city":"Rome"}',
         "id": "fc_2", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_a", "output": "21"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "25"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "Both."}]},
        {"role": "assistant", "content": "Warm in both."},
    ]
    call = lambda i, city: {"id": i, "type": "function", "function": {"name": "get_weather",  # noqa: E731
                                                                      "arguments": f'{{"city":"{city}"}}'}}
    assert request(input=items).audit_prompt() == chat_messages_of([
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "reasoning_content": "Two cities.",
         "tool_calls": [call("call_a", "Paris"), call("call_b", "Rome")]},
        {"role": "tool", "tool_call_id": "call_a", "content": "21"},
        {"role": "tool", "tool_call_id": "call_b", "content": "25"},
        {"role": "assistant", "content": "Warm in both.", "reasoning_content": "Both."}])


def test_a_call_after_an_assistant_message_joins_it():
    items = [{"role": "user", "content": "Go"}, {"role": "assistant", "content": "Looking."},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]
    [_, assistant] = request(input=items).audit_prompt()
    assert assistant["content"] == "Looking." and [c["id"] for c in assistant["tool_calls"]] == ["c"]


def test_function_tools_flat_and_in_namespaces_become_chat_tools_and_codex_hosted_tools_are_not_offered():
    wire = request(input="hi", tools=[WEATHER, {"type": "namespace", "name": "agents", "description": "A",
                                                "tools": [{"type": "function", "name": "spawn"}]},
                                      {"type": "web_search", "external_web_access": False}])
    tools = wire.function_tools()
    assert [t.function.name for t in tools] == ["get_weather", "spawn"]
    assert tools[0].function.parameters == WEATHER["parameters"] and tools[0].function.strict is True
    assert wire.namespaces() == {"spawn": "agents"}
    assert request(input="hi", tools=[{"type": "web_search"}]).function_tools() is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"tools": [WEATHER, {"type": "namespace", "name": "n", "tools": [{"type": "mcp"}]}]}, "tools[1].tools[0].type"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"input": []}, "input"),
])
def test_what_is_refused_names_its_field(fields, param):
    error = refused(**{"input": "hi", **fields})
    assert error.param == param
    assert isinstance(error, UnsupportedParameter) == param.endswith(".type")


@pytest.mark.parametrize(("fields", "param"), [
    ({"frobnicate": 1}, "frobnicate"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"truncation": "sometimes"}, "truncation"),
])
def test_bodies_that_do_not_parse_name_their_field(fields, param):
    with pytest.raises(InvalidRequest) as caught:
        request(**{"input": "hi", **fields})
    assert caught.value.param.startswith(param), caught.value.param


def test_every_field_codex_sends_is_accepted():
    wire = request(input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]}],
                   tools=[WEATHER], tool_choice="auto", parallel_tool_calls=True, reasoning={"summary": "auto"},
                   store=False, stream=True, include=["reasoning.encrypted_content"], prompt_cache_key="k",
                   client_metadata={"a": "b"})
    wire._check_fields()
    assert wire.sampling_fields().logprobs is False and wire.function_tools()
