"""The grammar that forces tool calls, compiled by the real xgrammar over SmolLM2's vocabulary and driven
by synthetic logits; every decoded output is read back by the format's own parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict

from orchestrator.structured.grammar.matcher import GrammarCache
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tool_parsers import ToolCallParser
from orchestrator.structured.tools import NamedToolChoice, ToolDefinition, plan_tools
from orchestrator.structured.vocabulary import load_vocabulary

from .synthetic import greedy_decode


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Weather(Strict):
    city: str
    unit: Literal["celsius", "fahrenheit"]


class Filter(Strict):
    field: str
    values: list[int]


class Search(Strict):
    query: str
    limit: int
    filters: list[Filter]


ARGUMENTS = {"get_weather": Weather, "search": Search, "ping": Strict}
TOOLS = [
    ToolDefinition.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} tool",
                "parameters": model.model_json_schema(),
            },
        }
    )
    for name, model in ARGUMENTS.items()
    if name != "ping"
] + [ToolDefinition.model_validate({"type": "function", "function": {"name": "ping"}})]  # no parameters


@pytest.fixture(scope="module")
def cache(smollm2_dir: Path) -> GrammarCache:
    return GrammarCache(load_vocabulary(smollm2_dir))


def decode_calls(smollm2_dir, cache, fmt, plan, seed):
    guide = tool_call_guide(plan, TOOL_FORMATS[fmt])
    text, _ = greedy_decode(smollm2_dir, cache, cache.new_state(guide), seed=seed)
    parser = ToolCallParser(TOOL_FORMATS[fmt], forced=True)
    events = parser.feed(text) + parser.finish()
    assert not [e for e in events if type(e).__name__ == "ContentDelta"], text
    for call in parser.calls:
        ARGUMENTS[call.name].model_validate_json(call.arguments)
    return parser.calls


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
@pytest.mark.parametrize("seed", [0, 1])
def test_required_calls_decode_to_valid_calls_in_every_format(smollm2_dir, cache, fmt, seed):
    calls = decode_calls(smollm2_dir, cache, fmt, plan_tools(TOOLS, "required", None), seed)
    assert len(calls) >= 1


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
def test_required_without_parallel_calls_makes_exactly_one_call(smollm2_dir, cache, fmt):
    calls = decode_calls(smollm2_dir, cache, fmt, plan_tools(TOOLS, "required", False), seed=2)
    assert len(calls) == 1


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
def test_a_named_choice_calls_exactly_that_function(smollm2_dir, cache, fmt):
    choice = NamedToolChoice.model_validate({"type": "function", "function": {"name": "search"}})
    calls = decode_calls(smollm2_dir, cache, fmt, plan_tools(TOOLS, choice, True), seed=4)
    assert [call.name for call in calls] == ["search"]


def test_the_grammar_accepts_what_the_format_writes_and_nothing_else(cache):
    plan = plan_tools(TOOLS, "required", True)
    for fmt, spec in TOOL_FORMATS.items():
        guide = tool_call_guide(plan, spec)
        good = spec.calls_text([("get_weather", {"city": "Paris", "unit": "celsius"}), ("ping", {})])
        bad_argument = spec.calls_text([("get_weather", {"city": "Paris", "unit": "kelvin"})])
        unknown_tool = spec.calls_text([("launch", {})])
        for text, complete in ((good, True), (bad_argument, False), (unknown_tool, False), ("", False)):
            state = cache.new_state(guide)
            matcher = state._matcher
            ok = matcher.accept_string(text) and matcher.accept_token(cache.vocabulary.stop_token_ids[0])
            assert ok == complete, (fmt, text)


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
def test_without_parallel_calls_the_grammar_ends_after_one_call(cache, fmt):
    """parallel_tool_calls false and a named choice: one call, then only the end is allowed (a second call of
    the same function is refused), so a model cannot repeat its call."""
    spec = TOOL_FORMATS[fmt]
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_weather"}})
    call = ("get_weather", {"city": "Paris", "unit": "celsius"})
    end = cache.vocabulary.stop_token_ids[0]
    for plan in (plan_tools(TOOLS, "required", False), plan_tools(TOOLS, named, True)):
        guide = tool_call_guide(plan, spec)
        once = cache.new_state(guide)._matcher
        assert once.accept_string(spec.calls_text([call])) and once.accept_token(end), fmt
        twice = cache.new_state(guide)._matcher
        assert not twice.accept_string(spec.calls_text([call, call])), fmt
        one_call = spec.calls_text([call])[: -len(spec.list_close) or None]  # before the list closes
        after_one = cache.new_state(guide)._matcher
        assert after_one.accept_string(one_call), fmt
        assert not after_one.accept_string(spec.separator.strip() or "<"), fmt  # no second call may open


def test_auto_and_none_need_no_grammar():
    assert tool_call_guide(plan_tools(TOOLS, "auto", None), TOOL_FORMATS["hermes"]) is None
    assert tool_call_guide(plan_tools(TOOLS, "none", None), TOOL_FORMATS["hermes"]) is None


def test_the_guide_is_a_structural_tag_naming_the_tools_field():
    guide = tool_call_guide(plan_tools(TOOLS[:1], "required", False), TOOL_FORMATS["mistral"])
    assert (guide.kind, guide.param) == ("structural_tag", "tools")
    tag = json.loads(guide.text)
    assert (tag["format"]["begin"], tag["format"]["end"]) == ("[TOOL_CALLS][", "]")
    calls = tag["format"]["content"]
    assert (calls["at_least_one"], calls["stop_after_first"], calls["separator"]) == (True, True, ", ")
    assert calls["tags"][0]["begin"] == '{"name": "get_weather", "arguments": '
