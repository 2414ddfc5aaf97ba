"""The Messages API's request body: its conversation as the chat-template messages chat completions would make,
its tools and tool_choice in chat's shape, which stop sequence ended an answer, and what it refuses by field
(no model, no server)."""

from __future__ import annotations

import orjson
import pytest

from orchestrator.api.http import validate
from orchestrator.api.messages_api.output import matched_stop, stop_reason, tool_input
from orchestrator.api.messages_api.wire import CountTokensRequest, MessagesRequest
from orchestrator.api.wire import ChatCompletionRequest
from orchestrator.engine.request import FinishReason
from orchestrator.errors import InvalidRequest, UnsupportedParameter
from orchestrator.structured.tools import plan_tools

WEATHER = {"name": "get_weather", "description": "Weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def request(**fields) -> MessagesRequest:
    return validate(orjson.dumps({"model": "m", "max_tokens": 8, **fields}), MessagesRequest)


def chat_messages_of(messages: list[dict]) -> list[dict]:
    """The template input chat completions makes of the same conversation: the reference."""
    return validate(orjson.dumps({"model": "m", "messages": messages}), ChatCompletionRequest).audit_prompt()


def test_system_blocks_and_a_string_turn():
    wire = request(system=[{"type": "text", "text": "A."}, {"type": "text", "text": "B.", "cache_control": {
        "type": "ephemeral"}}], messages=[{"role": "user", "content": "hi"}])
    assert wire.audit_prompt() == chat_messages_of([{"role": "system", "content": "A.\n\nB."},
                                                    {"role": "user", "content": "hi"}])


def test_a_tool_round_trip_is_chats_tool_calls_and_tool_messages():
    wire = request(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
            {"type": "text", "text": "And now?"}]},
    ], tools=[WEATHER])
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    assert wire.audit_prompt() == chat_messages_of([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call], "reasoning_content": "Look it up."},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "user", "content": "And now?"},
    ])


def test_an_assistant_turn_of_calls_only_has_no_content_and_redacted_thinking_is_left_out():
    wire = request(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xyz"},
                                          {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}]},
    ])
    assistant, tool = wire.audit_prompt()[1:]
    assert assistant["content"] is None and "reasoning_content" not in assistant
    assert tool == {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}


def test_a_system_turn_inside_messages_stays_where_it_is():
    wire = request(messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": "Note."}])
    assert [m["role"] for m in wire.audit_prompt()] == ["user", "system"]


@pytest.mark.parametrize("choice, mode", [({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
                                          ({"type": "none"}, "none"), ({"type": "tool", "name": "get_weather"}, "named")])
def test_tools_and_tool_choice_are_chats(choice, mode):
    wire = request(messages=[{"role": "user", "content": "x"}], tools=[WEATHER], tool_choice=choice)
    tools = wire.custom_tools()
    assert [t.function.name for t in tools] == ["get_weather"]
    assert tools[0].function.parameters == WEATHER["input_schema"]
    assert plan_tools(tools, *wire.chat_tool_choice()).mode == mode


def test_disable_parallel_tool_use_is_parallel_tool_calls_false():
    wire = request(messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
                   tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert wire.chat_tool_choice() == ("auto", False)
    assert plan_tools(wire.custom_tools(), *wire.chat_tool_choice()).parallel is False


@pytest.mark.parametrize("block, where", [
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}, "messages[0].content[0]"),
    ({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}, "messages[0].content[0]"),
])
def test_blocks_no_model_here_reads_are_refused_naming_them(block, where):
    with pytest.raises(UnsupportedParameter) as caught:
        request(messages=[{"role": "user", "content": [block]}]).audit_prompt()
    assert caught.value.param == f"{where}.type"


def test_server_tools_are_refused_naming_them():
    wire = request(messages=[{"role": "user", "content": "x"}], tools=[WEATHER, {"type": "bash_20250124",
                                                                                   "name": "bash"}])
    with pytest.raises(UnsupportedParameter) as caught:
        wire.custom_tools()
    assert caught.value.param == "tools[1].type"


@pytest.mark.parametrize("tool", [None, 5, "bash", [WEATHER]])
def test_a_tool_that_is_not_an_object_is_refused_naming_it(tool):
    with pytest.raises(InvalidRequest) as caught:
        request(messages=[{"role": "user", "content": "x"}], tools=[WEATHER, tool])
    assert caught.value.param.startswith("tools[1]")


def test_claude_codes_fields_are_accepted_and_unknown_ones_refused():
    request(messages=[{"role": "user", "content": "x"}], thinking={"type": "adaptive"}, metadata={"user_id": "u"},
            context_management={"edits": []}, output_config={"effort": "high"}, service_tier="standard_only",
            stream=True)
    with pytest.raises(InvalidRequest) as caught:
        request(messages=[{"role": "user", "content": "x"}], frobnicate=1)
    assert caught.value.param == "frobnicate"
    with pytest.raises(InvalidRequest) as caught:
        validate(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}), MessagesRequest)
    assert caught.value.param == "max_tokens"
    assert validate(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                    CountTokensRequest).model == "m"


def test_the_stop_sequence_that_ended_an_answer():
    assert matched_stop("one two", ("two", "wo", "x")) == "two"
    assert matched_stop("one two", ("x",)) is None
    assert stop_reason(FinishReason.STOP, "two") == "stop_sequence"
    assert stop_reason(FinishReason.STOP, None) == "end_turn"
    assert stop_reason(FinishReason.LENGTH, None) == "max_tokens"
    assert stop_reason(FinishReason.TOOL_CALLS, None) == "tool_use"


def test_tool_input_is_an_object():
    assert tool_input('{"city": "Paris"}') == {"city": "Paris"}
    assert tool_input("") == {} and tool_input("[1]") == {} and tool_input("{") == {}
