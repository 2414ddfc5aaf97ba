"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) through the official
`anthropic` client, against the real server on every backend: the message as the SDK types it, the stream's event
sequence, stream against whole message, count_tokens against usage, a tool round trip (on backends with output
constraints), stop sequences, max_tokens, and errors in Anthropic's shape.

Properties only, never a model's words: answers are compared with one another within the same run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anthropic
import pytest
from anthropic.types import Message

from tests.conformance.test_openai_api import COUNT, stop_string_in
from tests.conftest import DEFAULT_MODEL

pytestmark = pytest.mark.e2e

NATURAL_MAX = 200  # room enough for the model to end its answer to "Say hi" by itself
HI = [{"role": "user", "content": "Say hi"}]
SYSTEM = [{"type": "text", "text": "You are terse."},
          {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}}]
WEATHER = {
    "name": "get_weather", "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                     "required": ["city"], "additionalProperties": False},
}
GREEDY = {"temperature": 0}  # Anthropic's current API has no temperature; this server still reads it
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)


def text_of(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def assert_stop_agrees_with_usage(message: Message, max_tokens: int) -> None:
    """`max_tokens` exactly when the answer used all of them; `end_turn` only before that."""
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert (message.stop_reason == "max_tokens") == (message.usage.output_tokens == max_tokens)


def prompt_tokens(message: Message) -> int:
    usage = message.usage
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_create_returns_a_typed_message(claude):
    message = claude.messages.create(model=DEFAULT_MODEL, max_tokens=NATURAL_MAX, messages=HI, extra_body=GREEDY)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == DEFAULT_MODEL
    assert [block.type for block in message.content] == ["text"]
    assert message.usage.output_tokens > 0 and prompt_tokens(message) > 0
    assert_stop_agrees_with_usage(message, NATURAL_MAX)


def test_system_as_blocks_is_part_of_the_prompt(claude):
    plain = claude.messages.count_tokens(model=DEFAULT_MODEL, messages=HI)
    with_system = claude.messages.count_tokens(model=DEFAULT_MODEL, messages=HI, system=SYSTEM)
    as_string = claude.messages.count_tokens(model=DEFAULT_MODEL, messages=HI,
                                             system="\n\n".join(block["text"] for block in SYSTEM))
    message = claude.messages.create(model=DEFAULT_MODEL, max_tokens=16, messages=HI, system=SYSTEM, extra_body=GREEDY)
    assert with_system.input_tokens != plain.input_tokens
    assert with_system.input_tokens == as_string.input_tokens
    assert prompt_tokens(message) == with_system.input_tokens


def test_count_tokens_equals_the_messages_prompt(claude):
    counted = claude.messages.count_tokens(model=DEFAULT_MODEL, messages=COUNT, tools=[WEATHER])
    message = claude.messages.create(model=DEFAULT_MODEL, max_tokens=4, messages=COUNT, tools=[WEATHER],
                                     extra_body=GREEDY)
    assert prompt_tokens(message) == counted.input_tokens


def streamed(claude, **fields) -> tuple[list, Message]:
    with claude.messages.stream(model=DEFAULT_MODEL, **fields) as stream:  # the helper leaves out pings
        events = list(stream)
        return events, stream.get_final_message()


def raw_event_names(server, body: dict) -> list[str]:
    """The names of a streamed message's server-sent events, as sent."""
    request = urllib.request.Request(
        f"{server.base_url}/v1/messages?beta=true", method="POST",
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
        data=json.dumps({"model": DEFAULT_MODEL, "stream": True, **body}).encode())
    with urllib.request.urlopen(request, timeout=300) as response:
        lines = response.read().decode().splitlines()
    return [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]


def assert_well_formed(events: list) -> None:
    """message_start, then each block started before its deltas and stopped after them, blocks one after another
    with consecutive indexes, then message_delta and exactly one message_stop."""
    kinds = [e.type for e in events if e.type in ("message_start", "content_block_start", "content_block_delta",
                                                  "content_block_stop", "message_delta", "message_stop", "ping")]
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"] and kinds.count("message_stop") == 1
    open_index, next_index = None, 0
    for event in events:
        if event.type == "content_block_start":
            assert open_index is None and event.index == next_index
            open_index, next_index = event.index, next_index + 1
        elif event.type == "content_block_delta":
            assert event.index == open_index
        elif event.type == "content_block_stop":
            assert event.index == open_index
            open_index = None
    assert open_index is None and next_index >= 1


@pytest.mark.parametrize("messages", [HI, COUNT])
def test_stream_equals_create_at_temperature_0(claude, messages):
    whole = claude.messages.create(model=DEFAULT_MODEL, max_tokens=40, messages=messages, extra_body=GREEDY)
    events, final = streamed(claude, max_tokens=40, messages=messages, extra_body=GREEDY)
    assert_well_formed(events)
    assert text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_tokens(final) == prompt_tokens(whole)


def test_max_tokens_ends_the_answer_at_the_limit(claude):
    message = claude.messages.create(model=DEFAULT_MODEL, max_tokens=3, messages=COUNT, extra_body=GREEDY)
    assert_stop_agrees_with_usage(message, 3)
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == 3


def test_a_max_tokens_beyond_the_context_is_what_the_context_leaves(claude, limits):
    message = claude.messages.create(model=DEFAULT_MODEL, max_tokens=limits.max_seq_len * 4, messages=HI,
                                     extra_body=GREEDY)
    assert message.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_ends_the_answer_and_is_named(claude, stream):
    full = text_of(claude.messages.create(model=DEFAULT_MODEL, max_tokens=60, messages=COUNT, extra_body=GREEDY))
    stop, where = stop_string_in(full)
    fields = dict(max_tokens=60, messages=COUNT, extra_body=GREEDY, stop_sequences=[stop, "\u2603never"])
    if stream:
        _, message = streamed(claude, **fields)
    else:
        message = claude.messages.create(model=DEFAULT_MODEL, **fields)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert text_of(message) == full[:where]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(claude, features, stream):
    if not features.guided:
        pytest.skip("a forced tool call needs output constraints")
    fields = dict(max_tokens=100, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}, extra_body=GREEDY)
    if stream:
        events, message = streamed(claude, **fields)
        assert_well_formed(events)
    else:
        message = claude.messages.create(model=DEFAULT_MODEL, **fields)
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if block.type == "tool_use"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(calls[0].input, dict) and isinstance(calls[0].input["city"], str)
    assert set(calls[0].input) == {"city"} and len(calls[0].input["city"]) <= 20
    result = {"type": "tool_result", "tool_use_id": calls[0].id, "content": [{"type": "text", "text": "Sunny"}]}
    history = [*ASK, {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in message.content]},
               {"role": "user", "content": [result]}]
    answer = claude.messages.create(model=DEFAULT_MODEL, max_tokens=30, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content and answer.content[0].type == "text"
    assert prompt_tokens(answer) == claude.messages.count_tokens(
        model=DEFAULT_MODEL, messages=history, tools=[WEATHER], tool_choice={"type": "none"}).input_tokens


def test_claude_code_shaped_request_is_accepted(claude, backend):
    """The fields, block and tool shapes Claude Code sends on its first turn (synthetic content). Its
    `max_tokens` (32,000, beyond any context here) is cut to the context's room: that is the test above; here a
    sampled answer is kept short so that the test does not wait out a whole context of tokens."""
    tool = {**WEATHER, "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema",
                                        **WEATHER["input_schema"]}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "<note>today</note>"},
                                              {"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": "Tools are described above."}]
    body = dict(model=DEFAULT_MODEL, max_tokens=NATURAL_MAX, messages=messages, tools=[tool],
                system=[{"type": "text", "text": "header: x;"}, *SYSTEM], metadata={"user_id": '{"session": "s"}'},
                thinking={"type": "adaptive"})
    extra = {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
             "output_config": {"effort": "high"}}
    headers = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}
    with claude.messages.stream(extra_body=extra, extra_headers=headers, **body) as stream:
        events = list(stream)
        message = stream.get_final_message()
    assert_well_formed(events)
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_a_raw_stream_pings_after_message_start(server):
    names = raw_event_names(server, {"max_tokens": 8, "messages": HI, **GREEDY})
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_a_query_string_is_accepted(server):
    request = urllib.request.Request(
        f"{server.base_url}/v1/messages?beta=true", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": DEFAULT_MODEL, "max_tokens": 2, "messages": HI}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.loads(response.read())["type"] == "message"


def test_unknown_model_is_not_found(claude):
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=HI)
    assert caught.value.body["error"]["type"] == "not_found_error"


def test_unknown_field_is_refused_naming_it(claude):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=DEFAULT_MODEL, max_tokens=4, messages=HI, extra_body={"frobnicate": 1})
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "frobnicate" in caught.value.body["error"]["message"]


def test_missing_max_tokens_is_refused_naming_it(server):
    request = urllib.request.Request(
        f"{server.base_url}/v1/messages", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": DEFAULT_MODEL, "messages": HI}).encode())
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    body = json.loads(caught.value.read())
    assert caught.value.code == 400 and body["type"] == "error" and "max_tokens" in body["error"]["message"]


def test_server_tools_and_images_are_refused_naming_them(claude):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=DEFAULT_MODEL, max_tokens=4, messages=HI,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "tools[0].type" in caught.value.body["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=DEFAULT_MODEL, max_tokens=4,
                               messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}])
    assert "messages[0].content[0]" in caught.value.body["error"]["message"]


def test_a_prompt_over_the_context_is_too_long(claude, limits):
    words = " ".join(["hello"] * (limits.max_input_len + 10))
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=DEFAULT_MODEL, max_tokens=4, messages=[{"role": "user", "content": words}])
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and "prompt is too long" in error["message"]
