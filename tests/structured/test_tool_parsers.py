"""Streaming tool-call parsers on recorded outputs, fed whole, one character at a time, and split in two
at every position: the content, the calls and the event stream must not depend on how text arrives."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_parsers import (
    ContentDelta,
    ToolCallArguments,
    ToolCallParser,
    ToolCallStart,
    delta_of,
    new_call_id,
)

WEATHER = {"city": "Paris", "unit": "celsius"}
NESTED = {
    "query": 'a } tricky "string" with ] brackets',
    "filters": [{"k": "x", "v": [1, 2.5, None]}],
    "ok": True,
}


def ids():
    return iter(f"call_{i:024x}" for i in range(100)).__next__


def run(fmt: str, chunks: list[str], *, forced: bool = False):
    parser = ToolCallParser(TOOL_FORMATS[fmt], forced=forced, id_factory=ids())
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    events += parser.finish()
    return events, parser.calls


def summary(events, calls):
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return content, [(c.id, c.name, c.arguments) for c in calls]


def splits(text: str):
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


# (format, recorded output, expected content, expected calls as (name, arguments object), forced)
RECORDED = [
    (
        "hermes",
        'I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "search", "arguments": '
        + json.dumps(NESTED)
        + "}\n</tool_call>",
        "I will look both up.\n",
        [("get_weather", WEATHER), ("search", NESTED)],
        False,
    ),
    (
        "hermes",
        '<tool_call>\n{"arguments": {"city": "Paris", "unit": "celsius"}, "name": "get_weather"}\n</tool_call>',
        "",
        [("get_weather", WEATHER)],
        False,
    ),
    (
        "hermes",
        "The answer is 4 < 5, and <tool_calls> are not needed.",
        "The answer is 4 < 5, and <tool_calls> are not needed.",
        [],
        False,
    ),
    (
        "hermes",
        "<tool_call>\nI cannot call tools.\n</tool_call>",
        "<tool_call>\nI cannot call tools.\n</tool_call>",
        [],
        False,
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\nDone, see above.',
        "Done, see above.",
        [("get_weather", WEATHER)],
        False,
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; {"name": "search", "parameters": '
        + json.dumps(NESTED)
        + "}",
        "",
        [("get_weather", WEATHER), ("search", NESTED)],
        False,
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
        False,
    ),
    ("llama3_json", '{"name": "Ada", "born": 1815}', '{"name": "Ada", "born": 1815}', [], False),
    (
        "llama3_json",
        'Paris is in France. {"name": "x", "parameters": {}}',
        'Paris is in France. {"name": "x", "parameters": {}}',
        [],
        False,
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "search", '
        '"arguments": ' + json.dumps(NESTED) + "}]",
        "",
        [("get_weather", WEATHER), ("search", NESTED)],
        False,
    ),
    (
        "mistral",
        'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}]',
        "Checking. ",
        [("get_weather", WEATHER)],
        False,
    ),
    ("mistral", "Use [TOOL] brackets [like this].", "Use [TOOL] brackets [like this].", [], False),
    # Forced calls: the marker may be missing (a detokeniser that skips special tokens drops it).
    (
        "mistral",
        '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        "",
        [("get_weather", WEATHER)],
        True,
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        "",
        [("get_weather", WEATHER)],
        True,
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
        True,
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "",
        [("get_weather", WEATHER)],
        True,
    ),
]


@pytest.mark.parametrize(("fmt", "text", "content", "calls", "forced"), RECORDED)
def test_recorded_outputs_parse_the_same_however_they_are_split(fmt, text, content, calls, forced):
    for chunks in splits(text):
        events, parsed = run(fmt, chunks, forced=forced)
        got_content, got_calls = summary(events, parsed)
        assert got_content == content, chunks
        assert [(name, json.loads(arguments)) for _, name, arguments in got_calls] == calls, chunks
        assert [call_id for call_id, _, _ in got_calls] == [f"call_{i:024x}" for i in range(len(calls))]
        check_event_stream(events, parsed)


def check_event_stream(events, calls):
    """One start per call, in order, before any of its arguments; the fragments join to its arguments."""
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [(i, c.id, c.name) for i, c in enumerate(calls)]
    for index, call in enumerate(calls):
        start_at = events.index(starts[index])
        fragments = [
            (i, e) for i, e in enumerate(events) if isinstance(e, ToolCallArguments) and e.index == index
        ]
        assert all(i > start_at for i, _ in fragments)
        assert "".join(e.fragment for _, e in fragments) == call.arguments


def test_arguments_stream_before_the_call_is_complete():
    parser = ToolCallParser(TOOL_FORMATS["hermes"], id_factory=ids())
    events = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert events == [
        ToolCallStart(0, "call_" + "0" * 24, "get_weather"),
        ToolCallArguments(0, '{"city": "Pa'),
    ]
    assert parser.feed('ris"}}\n</tool_call>') == [ToolCallArguments(0, 'ris"}')]
    assert parser.finish() == []
    assert parser.calls[0].arguments == '{"city": "Paris"}'


def test_only_a_possible_marker_start_is_held_back():
    parser = ToolCallParser(TOOL_FORMATS["hermes"])
    assert parser.feed("Hello <tool") == [ContentDelta("Hello ")]
    assert parser.feed("box> and more") == [ContentDelta("<toolbox> and more")]
    assert parser.feed(" <") == [ContentDelta(" ")]
    assert parser.finish() == [ContentDelta("<")]


def test_llama3_json_holds_an_answer_that_opens_like_a_call_until_it_is_known():
    parser = ToolCallParser(TOOL_FORMATS["llama3_json"])
    assert parser.feed('{"name": "Ada", ') == []
    assert parser.feed('"born": 1815}') == [ContentDelta('{"name": "Ada", "born": 1815}')]
    plain = ToolCallParser(TOOL_FORMATS["llama3_json"])
    assert plain.feed("Hi") == [ContentDelta("Hi")]  # not a call: text flows at once


def test_a_call_cut_short_ends_as_it_stands():
    events, calls = run("hermes", ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'])
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Par')]
    check_event_stream(events, calls)


def test_openai_shapes_of_calls_and_deltas():
    events, calls = run("mistral", ['[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]'])
    assert [delta_of(e) for e in events] == [
        {"index": 0, "id": calls[0].id, "type": "function", "function": {"name": "f", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"a": 1}'}},
    ]
    assert calls[0].to_openai() == {
        "id": calls[0].id,
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1}'},
    }
    assert re.fullmatch(r"call_[0-9a-f]{24}", new_call_id())


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
def test_every_format_parses_what_it_writes(fmt):
    spec = TOOL_FORMATS[fmt]
    text = spec.calls_text([("get_weather", WEATHER), ("search", NESTED)])
    for forced in (False, True):
        events, calls = run(fmt, list(text), forced=forced)
        assert summary(events, calls)[0] == ""
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", WEATHER),
            ("search", NESTED),
        ]
