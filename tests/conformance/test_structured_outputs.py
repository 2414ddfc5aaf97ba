"""Structured outputs and tool calls with the official `openai` client against the real server on the embedded
default (SmolLM2-135M, hf backend): a grammar enforces every constraint, so even this small model returns objects
that parse and calls whose arguments validate."""

from __future__ import annotations

import json
from enum import StrEnum

import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import DEFAULT_MODEL, admin_models

pytestmark = pytest.mark.e2e


class Color(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Address(BaseModel):
    city: str = Field(max_length=20)
    zip_code: int


class Person(BaseModel):
    name: str = Field(max_length=20)
    favourite: Color
    tags: list[str] = Field(max_length=3)
    home: Address


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
                                                     "required": ["zone"], "additionalProperties": False}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(autouse=True)
def _guided_backend(features) -> None:
    if not features.guided:
        pytest.skip("this backend refuses output constraints with a 400 (test_client_fields.py checks it)")


@pytest.fixture(scope="module")
def model() -> str:
    """The model the suite runs on (tests/trtllm/test_structured.py runs it on a real TensorRT-LLM engine)."""
    return DEFAULT_MODEL


def _valid_weather_arguments(arguments: str) -> dict:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    return args


# -- response_format --------------------------------------------------------------------------------------------
def test_parse_returns_an_object_of_the_pydantic_model(client, model):
    reply = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=Person, temperature=0, max_tokens=300,
    )
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.home, Address) and person.favourite in Color
    assert reply.choices[0].finish_reason == "stop"


def test_a_streamed_answer_parses_too(client, model):
    with client.chat.completions.stream(
        model=model, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=Person, temperature=0.7, seed=3, max_tokens=300,
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)


def test_json_object_gives_a_json_object(client, model):
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Describe a cat as JSON with keys name and age."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=200,
    )
    content, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    # Every character was held to the grammar; a reply the model ended is a whole object. (A small quantized model
    # can fall into repeating keys, which JSON allows, until max_tokens: then what came is an object's beginning.)
    assert _json_object_accepts(content), f"not the beginning of a JSON object: {content!r}"
    if finish == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert finish == "length", finish


def _json_object_accepts(text: str) -> bool:
    """Whether `text` is a JSON object or the beginning of one (xgrammar's own matcher, byte by byte)."""
    import xgrammar as xgr

    grammar = xgr.GrammarCompiler(xgr.TokenizerInfo(["{"])).compile_json_schema('{"type": "object"}')
    return xgr.GrammarMatcher(grammar, terminate_without_stop_token=True).accept_string(text)


def test_structured_outputs_choice_and_regex(client, model):
    choice = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is the sky green?"}], max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert choice.choices[0].message.content in ("yes", "no", "maybe")
    regex = client.completions.create(
        model=model, prompt="A date:", max_tokens=20, temperature=0.9, seed=1,
        extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}},
    )
    assert __import__("re").fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", regex.choices[0].text)


def test_an_invalid_schema_is_a_400_naming_the_problem_and_others_are_served(server, client, model):
    pid = admin_models(server.base_url)[model]["pid"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model, messages=ASK, max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}},
        )
    assert caught.value.body["param"] == "response_format.json_schema.schema"
    assert "no-such-type" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=5,
                                       extra_body={"structured_outputs": {"regex": "(unclosed"}})
    assert caught.value.body["param"] == "structured_outputs.regex"
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=3)
    assert reply.choices[0].message.content
    assert admin_models(server.base_url)[model]["pid"] == pid  # the engine never saw the bad grammars


def test_a_grammar_too_costly_per_step_or_too_deep_is_a_400_naming_its_field(server, client, model):
    pid = admin_models(server.base_url)[model]["pid"]
    for body, words in [
        ({"structured_outputs": {"regex": "([a-z ]{64}\n){8}"}, "n": 16}, "ms per row per decoding step"),
        ({"structured_outputs": {"regex": "(" * 40 + "a" + ")" * 40}}, "40 groups deep"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=model, prompt="Words:", max_tokens=5, extra_body=body)
        assert caught.value.body["param"] == "structured_outputs.regex"
        assert words in caught.value.body["message"]
    assert admin_models(server.base_url)[model]["pid"] == pid


# -- tools ------------------------------------------------------------------------------------------------------
def test_required_tool_calls_have_arguments_that_validate(client, model):
    reply = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        _valid_weather_arguments(call.function.arguments)
    else:
        assert set(args) == {"zone"}


def _calls_of_stream(stream) -> tuple[list[tuple[str, str]], str | None]:
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for entry in choice.delta.tool_calls or ():
                call = calls.setdefault(entry.index, [entry.function.name or "", ""])
                call[1] += entry.function.arguments or ""
            finish = choice.finish_reason or finish
    return [(name, arguments) for _, (name, arguments) in sorted(calls.items())], finish


@pytest.mark.parametrize("max_tokens", [12, 40, 300])
def test_required_calls_are_whole_and_never_repeat(client, model, max_tokens):
    """With parallel calls allowed a small model may go on calling: a call identical to an earlier one ends the turn
    (it is not returned), and a call cut by max_tokens is not returned either, so every returned call parses and
    none repeats another; finish_reason is length only when max_tokens was reached; a stream says the same."""
    ask = dict(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0,
               max_tokens=max_tokens)
    reply = client.chat.completions.create(**ask)
    choice = reply.choices[0]
    calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or ()]
    values = [(name, json.loads(arguments)) for name, arguments in calls]
    for name, args in values:
        assert name in ("get_weather", "get_time")
        assert set(args) == ({"city", "unit"} if name == "get_weather" else {"zone"})
    assert all(values[i] != values[j] for i in range(len(values)) for j in range(i)), calls
    if choice.finish_reason == "length":
        assert reply.usage.completion_tokens == max_tokens
    else:
        assert choice.finish_reason == "tool_calls" and calls and reply.usage.completion_tokens <= max_tokens
    assert _calls_of_stream(client.chat.completions.create(**ask, stream=True)) == (calls, choice.finish_reason)


def test_a_named_tool_choice_calls_exactly_that_function_once(client, model):
    reply = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], temperature=0.8, seed=5, max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    calls = reply.choices[0].message.tool_calls
    assert [call.function.name for call in calls] == ["get_weather"]
    _valid_weather_arguments(calls[0].function.arguments)


def test_streamed_tool_calls_come_as_openai_sends_them(client, model):
    stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                            tool_choice="required", parallel_tool_calls=False, temperature=0,
                                            max_tokens=200, stream=True)
    chunks = list(stream)
    entries = [entry for chunk in chunks if chunk.choices for entry in (chunk.choices[0].delta.tool_calls or [])]
    assert entries[0].index == 0 and entries[0].id.startswith("call_") and entries[0].function.name == "get_weather"
    assert all(entry.id is None and entry.function.name is None for entry in entries[1:])
    _valid_weather_arguments("".join(entry.function.arguments or "" for entry in entries))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_three_turn_conversation_with_a_tool_result(client, model):
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=200)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    answer = client.chat.completions.create(model=model, messages=history, tools=[WEATHER],
                                            temperature=0, max_tokens=40)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls


def test_tool_choice_none_never_calls(client, model):
    reply = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none",
                                           temperature=0, max_tokens=20)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")


def test_bad_tool_requests_are_refused_by_field(client, model):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=5,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert caught.value.body["param"] == "tool_choice.function.name"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       response_format={"type": "json_object"}, max_tokens=5)
    assert "at most one output constraint" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK, response_format={"type": "json_object"},
                                       max_tokens=5, extra_body={"ignore_eos": True})
    assert caught.value.body["param"] == "ignore_eos"
