"""OpenAI's Responses API (`POST /v1/responses`) through the official `openai` client, against the real server on
every backend: the response object as the SDK types it, the stream's event sequence, stream against whole
response, function tools and structured output (on backends with output constraints), and refusals by field.

Properties only, never a model's words: answers are compared with one another within the same run."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response
from pydantic import BaseModel, Field

from tests.conftest import DEFAULT_MODEL

pytestmark = pytest.mark.e2e

NATURAL_MAX = 200  # room enough for the model to end its answer to "Say hi" by itself
SHORT = 8
WEATHER = {
    "type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int


def raw_response(client: openai.OpenAI, **fields) -> dict:
    return client.responses.with_raw_response.create(model=DEFAULT_MODEL, **fields).http_response.json()


def streamed(client: openai.OpenAI, **fields) -> list:
    """Every event of a streamed response, as the SDK's stream helper types them."""
    with client.responses.stream(model=DEFAULT_MODEL, **fields) as stream:
        return list(stream)


def assert_well_formed(events: list) -> dict:
    """created, in_progress, then each item added before its content and done after it, items one after another,
    then exactly one terminal event; sequence numbers 0, 1, 2...; returns the terminal event's response."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.type in TERMINAL for e in events] == [False] * (len(events) - 1) + [True]
    open_item, done = None, []
    for event in events[2:-1]:
        if event.type == "response.output_item.added":
            assert open_item is None and event.output_index == len(done)
            open_item = event.item.id
        elif event.type == "response.output_item.done":
            assert event.item.id == open_item
            done.append(event.item)
            open_item = None
        else:
            assert event.item_id == open_item and event.output_index == len(done), event
    assert open_item is None
    final = events[-1].response
    assert [item.id for item in final.output] == [item.id for item in done]
    return final


def assert_status_agrees_with_usage(response, max_output_tokens: int) -> None:
    assert response.status in ("completed", "incomplete")
    incomplete = response.status == "incomplete"
    assert incomplete == (response.usage.output_tokens == max_output_tokens), (response.status, response.usage)
    assert (response.incomplete_details is not None) == incomplete
    if incomplete:
        assert response.incomplete_details.reason == "max_output_tokens"


# -- answers ----------------------------------------------------------------------------------------------------
def test_a_string_input_gets_a_response_the_sdk_types_without_losing_a_field(client):
    body = raw_response(client, input="Say hi", temperature=0, max_output_tokens=SHORT, metadata={"run": "1"})
    typed = Response.model_validate(body)
    assert set(body) <= set(typed.model_dump(exclude_unset=True)), set(body) - set(typed.model_dump(exclude_unset=True))
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["error"] is None
    assert body["model"] == DEFAULT_MODEL and body["metadata"] == {"run": "1"} and "output_text" not in body
    [message] = typed.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert typed.output_text == message.content[0].text
    usage = typed.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= SHORT
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0 and usage.input_tokens_details.cached_tokens >= 0
    assert_status_agrees_with_usage(typed, SHORT)


def test_items_with_instructions_put_the_instructions_in_the_prompt(client):
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}]
    bare = client.responses.create(model=DEFAULT_MODEL, input=items, temperature=0, max_output_tokens=SHORT)
    told = client.responses.create(model=DEFAULT_MODEL, input=items, instructions="You answer in French.",
                                   temperature=0, max_output_tokens=SHORT)
    assert told.instructions == "You answer in French." and bare.instructions is None
    assert told.usage.input_tokens > bare.usage.input_tokens
    assert told.output_text and bare.output_text


def test_max_output_tokens_ends_incomplete_with_its_reason_whole_and_streamed(client):
    whole = client.responses.create(model=DEFAULT_MODEL, input="Count from one to fifty.", temperature=0,
                                    max_output_tokens=3)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 3 and whole.output[0].status == "incomplete"
    events = streamed(client, input="Count from one to fifty.", temperature=0, max_output_tokens=3)
    final = assert_well_formed(events)
    assert events[-1].type == "response.incomplete" and final.status == "incomplete"
    assert final.output_text == whole.output_text and final.usage.output_tokens == 3


def test_a_stream_gives_the_same_response_as_a_whole_one(client):
    fields = {"input": "Say hi", "temperature": 0, "max_output_tokens": NATURAL_MAX}
    whole = client.responses.create(model=DEFAULT_MODEL, **fields)
    with client.responses.stream(model=DEFAULT_MODEL, **fields) as stream:
        events = list(stream)
        final = stream.get_final_response() if events[-1].type == "response.completed" else events[-1].response
    assert final.output_text == whole.output_text and final.status == whole.status
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens, whole.usage.output_tokens)
    assert assert_well_formed(events).output_text == whole.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert_status_agrees_with_usage(whole, NATURAL_MAX)


def test_included_logprobs_are_those_chat_gives_for_the_same_conversation(client, features):
    include = ["message.output_text.logprobs"]
    if not features.logprobs:
        assert refusal(client, input="Say hi", include=include)["param"] == "include"
        return
    top = 2 if features.top_logprobs else 0
    fields = {"input": "Say hi", "include": include, "top_logprobs": top, "temperature": 0, "max_output_tokens": 6}
    part = client.responses.create(model=DEFAULT_MODEL, **fields).output[0].content[0]
    chat = client.chat.completions.create(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hi"}],
                                          logprobs=True, top_logprobs=top, temperature=0, max_tokens=6)
    reference = chat.choices[0].logprobs.content
    assert [(p.token, len(p.top_logprobs)) for p in part.logprobs] == [(c.token, top) for c in reference]
    assert all(p.logprob <= 0 and [a.logprob for a in p.top_logprobs] == sorted(
        (a.logprob for a in p.top_logprobs), reverse=True) for p in part.logprobs)  # values vary with batching
    events = streamed(client, **fields)
    tokens = [entry.token for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    assert tokens == [p.token for p in part.logprobs]


# -- tools and structured output (backends with output constraints) ------------------------------------------------
@pytest.fixture
def guided(features) -> None:
    if not features.guided:
        pytest.skip("this backend refuses output constraints with a 400 (test_client_fields.py checks it)")


def test_a_function_tool_round_trip(client, guided):
    first = client.responses.create(model=DEFAULT_MODEL, input=ASK, tools=[WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, temperature=0, max_output_tokens=100)
    [call] = first.output
    assert call.type == "function_call" and call.id.startswith("fc_") and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"} and call.call_id and first.status == "completed"
    history = [*ASK, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"celsius": 21})}]
    answer = client.responses.create(model=DEFAULT_MODEL, input=history, tools=[WEATHER], tool_choice="none",
                                     temperature=0, max_output_tokens=SHORT)
    assert answer.output_text and [item.type for item in answer.output] == ["message"]
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    chat_call = {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    same = client.chat.completions.create(  # the same conversation through chat completions
        model=DEFAULT_MODEL, tools=[chat_tool], tool_choice="none", temperature=0, max_tokens=SHORT, messages=[
            *ASK, {"role": "assistant", "content": None, "tool_calls": [chat_call]},
            {"role": "tool", "tool_call_id": call.call_id, "content": json.dumps({"celsius": 21})}])
    assert answer.usage.input_tokens == same.usage.prompt_tokens
    assert answer.output_text == same.choices[0].message.content


def test_a_streamed_function_call_equals_the_whole_one(client, guided):
    fields = {"input": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
              "temperature": 0, "max_output_tokens": 100}
    whole = client.responses.create(model=DEFAULT_MODEL, **fields)
    events = streamed(client, **fields)
    final = assert_well_formed(events)
    assert [(c.name, c.arguments, c.call_id[:5]) for c in final.output] == [
        (c.name, c.arguments, c.call_id[:5]) for c in whole.output]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == whole.output[0].arguments


def test_text_format_json_schema_gives_json_that_validates(client, guided):
    schema = City.model_json_schema()
    reply = client.responses.create(model=DEFAULT_MODEL, input="Name a city.", temperature=0, max_output_tokens=80,
                                    text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                     "strict": True}})
    City.model_validate_json(reply.output_text)
    assert reply.text.format.type == "json_schema"
    parsed = client.responses.parse(model=DEFAULT_MODEL, input="Name a city.", text_format=City, temperature=0,
                                    max_output_tokens=80)
    assert isinstance(parsed.output_parsed, City)


# -- what clients send ------------------------------------------------------------------------------------------
def test_a_body_shaped_as_codex_sends_it_is_served(client):
    """Codex CLI's first request: its fields, developer and user message items of input_text parts, function
    tools, a namespace of function tools and a hosted web_search tool; no instructions, streamed."""
    function = {**WEATHER, "strict": False}
    body = {
        "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "a-session",
        "client_metadata": {"turn_id": "t-1", "turn_metadata": '{"sandbox": "read-only"}'},
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are an agent."}]},
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "Read only."}, {"type": "input_text", "text": "Ask first."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<context>cwd</context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]},
        ],
        "tools": [function, {"type": "namespace", "name": "agents", "description": "Agents",
                             "tools": [{**function, "name": "spawn_agent"}]},
                  {"type": "web_search", "external_web_access": False}],
    }
    extra = {"client_metadata": body.pop("client_metadata")}  # a field the SDK's typed arguments do not have
    events = streamed(client, max_output_tokens=SHORT, extra_body=extra, **body)
    final = assert_well_formed(events)
    assert final.store is False and final.prompt_cache_key == "a-session"
    assert [tool.type for tool in final.tools] == ["function", "namespace", "web_search"]


# -- refusals ---------------------------------------------------------------------------------------------------
def refusal(client: openai.OpenAI, **fields) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=DEFAULT_MODEL, **fields)
    return caught.value.body


def test_an_unknown_field_is_a_400_naming_it(client):
    assert refusal(client, input="hi", extra_body={"frobnicate": 1})["param"] == "frobnicate"


def test_an_input_longer_than_the_context_is_context_length_exceeded_naming_input(client, limits):
    body = refusal(client, input="hi " * (limits.max_input_len + 10), max_output_tokens=SHORT)
    assert (body["code"], body["param"]) == ("context_length_exceeded", "input")


def test_an_unknown_previous_response_or_a_hosted_tool_is_refused_by_field(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=DEFAULT_MODEL, input="hi", previous_response_id="resp_1")
    assert caught.value.body["param"] == "previous_response_id"
    assert refusal(client, input="hi", background=True, stream=True)["param"] == "stream"
    body = refusal(client, input="hi", tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}])
    assert body["param"] == "tools[0].type" and "file_search" in body["message"]
