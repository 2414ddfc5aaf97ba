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


def test_a_call_is_sent_whole_once_its_arguments_are_complete():
    parser = ToolCallParser(TOOL_FORMATS["hermes"], id_factory=ids())
    assert parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa') == []
    assert parser.feed('ris"}}\n</tool_call>') == [
        ToolCallStart(0, "call_" + "0" * 24, "get_weather"),
        ToolCallArguments(0, '{"city": "Paris"}'),
    ]
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


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
@pytest.mark.parametrize("forced", [False, True])
def test_a_call_cut_short_is_neither_a_call_nor_content(fmt, forced):
    """Output ended by max_tokens inside the second call: the first stands; the second is dropped wherever its
    object was cut (its opening, head or arguments), and stands once its object is complete (only its closing
    text cut)."""
    spec = TOOL_FORMATS[fmt]
    first = spec.calls_text([("get_weather", WEATHER)])[: -len(spec.list_close) or None]
    whole = spec.calls_text([("get_weather", WEATHER), ("search", NESTED)])
    object_end = len(whole) - len(spec.list_close) - len(spec.call_close)
    for cut in range(len(first) + len(spec.separator.strip()) + 1, len(whole) - len(spec.list_close)):
        expected = [("get_weather", WEATHER)] + ([("search", NESTED)] if cut >= object_end else [])
        for chunks in ([whole[:cut]], list(whole[:cut])):
            events, calls = run(fmt, chunks, forced=forced)
            assert summary(events, calls)[0] == "", whole[:cut]
            assert [(c.name, json.loads(c.arguments)) for c in calls] == expected, whole[:cut]
            check_event_stream(events, calls)


def test_a_lone_call_cut_short_leaves_no_call():
    for forced in (False, True):
        events, calls = run("hermes", ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'],
                            forced=forced)
        assert (events, calls) == ([], [])


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
@pytest.mark.parametrize("forced", [False, True])
def test_a_call_that_repeats_an_earlier_one_ends_the_turn(fmt, forced):
    """Same name and the same arguments as JSON values (key order and spacing aside): the repeat is dropped, the
    parser reads nothing more and says the turn ended; a call of the same function with other arguments stands."""
    spec = TOOL_FORMATS[fmt]
    reordered = '{"unit":"celsius",  "city":"Paris"}'
    text = spec.calls_text([("get_weather", WEATHER), ("get_weather", {"city": "Rome"}),
                            ("get_weather", reordered), ("search", NESTED)])
    for chunks in (list(text), [text]):
        events, calls = run(fmt, chunks, forced=forced)
        assert summary(events, calls)[0] == ""
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", WEATHER), ("get_weather", {"city": "Rome"})]
        assert [c.id for c in calls] == [f"call_{i:024x}" for i in range(2)]
        check_event_stream(events, calls)
    parser = ToolCallParser(spec, forced=forced)
    parser.feed(spec.calls_text([("get_weather", WEATHER)] * 2))
    assert parser.ended and parser.feed(spec.calls_text([("search", NESTED)])) == [] and parser.finish() == []
    assert [c.name for c in parser.calls] == ["get_weather"]


def test_calls_that_differ_do_not_end_the_turn():
    text = TOOL_FORMATS["hermes"].calls_text([("f", {"a": 1}), ("g", {"a": 1}), ("f", {"a": 1.5}), ("f", "{}")])
    _, calls = run("hermes", [text])
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}'), ("g", '{"a": 1}'), ("f", '{"a": 1.5}'),
                                                      ("f", "{}")]


def test_openai_shapes_of_calls_and_deltas():
    events, calls = run("mistral", ['[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]'])
    assert [delta_of(e) for e in events] == [
        {"index": 0, "id": calls[0].id, "type": "function", "function": {"name": "f", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"a": 1}'}},
    ]
    assert (calls[0].name, calls[0].arguments) == ("f", '{"a": 1}')
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
