"""Structural tags rewritten as EBNF (for engines that take EBNF only) accept exactly what the tag accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.structured.grammar.compile import compile_guide
from orchestrator.structured.grammar.lowering import structural_tag_as_ebnf
from orchestrator.structured.grammar.matcher import GrammarCache
from orchestrator.structured.guide import Guide
from orchestrator.structured.reasoning import after_reasoning
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tools import NamedToolChoice, plan_tools
from orchestrator.structured.vocabulary import load_vocabulary

from .test_tool_grammar import TOOLS

WEATHER = {"city": "Paris", "unit": "celsius"}
SEARCH = {"query": "q", "limit": 3, "filters": [{"field": "year", "values": [2024]}]}


@pytest.fixture(scope="module")
def cache(smollm2_dir: Path) -> GrammarCache:
    return GrammarCache(load_vocabulary(smollm2_dir))


def accepts(cache: GrammarCache, guide: Guide, text: str) -> bool:
    matcher = cache.new_state(guide)._matcher
    return matcher.accept_string(text) and matcher.accept_token(cache.vocabulary.stop_token_ids[0])


def samples(fmt) -> list[str]:
    return [
        fmt.calls_text([("get_weather", WEATHER)]),
        fmt.calls_text([("get_weather", WEATHER), ("search", SEARCH), ("ping", {})]),
        fmt.calls_text([("search", SEARCH)]),
        fmt.calls_text([("get_weather", {"city": "Paris", "unit": "kelvin"})]),
        fmt.calls_text([("get_weather", {"city": "Paris"})]),
        fmt.calls_text([("launch", {})]),
        "",
        "plain text",
    ]


NAMED = NamedToolChoice.model_validate({"type": "function", "function": {"name": "search"}})


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
@pytest.mark.parametrize(("choice", "parallel"), [("required", True), ("required", False), (NAMED, None)])
def test_the_ebnf_form_of_a_tool_grammar_accepts_the_same_outputs(cache, fmt, choice, parallel):
    spec = TOOL_FORMATS[fmt]
    tag = tool_call_guide(plan_tools(TOOLS, choice, parallel), spec)
    ebnf = Guide("ebnf", structural_tag_as_ebnf(tag.text))
    assert ebnf.text.count("\nroot ::= ") + ebnf.text.startswith("root ::= ") == 1
    verdicts = [(accepts(cache, tag, s), accepts(cache, ebnf, s)) for s in samples(spec)]
    assert all(a == b for a, b in verdicts), verdicts
    assert any(a for a, _ in verdicts) and not all(a for a, _ in verdicts)


def test_the_ebnf_form_after_a_thinking_block(cache):
    tag = after_reasoning(Guide("json_object"), opened_by_prompt=True)
    ebnf = Guide("ebnf", structural_tag_as_ebnf(tag.text))
    for text, expected in [
        ("hm</think>\n{}", True),
        ('x</think>{"a": [1]}', True),
        ("{}", False),
        ("</think>[]", False),
    ]:
        assert accepts(cache, tag, text) == expected == accepts(cache, ebnf, text), text


def test_a_tag_whose_root_is_already_root_is_printed_as_is(cache):
    tag = json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}})
    text = structural_tag_as_ebnf(tag)
    assert text.startswith("root ::= ")
    compile_guide(cache._compiler, "ebnf", text)
