"""Reasoning: the thinking/answer splitter on recorded streams, split at every position, and constraints
that begin after the thinking block, compiled by xgrammar and driven from recorded thinking tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel
from tokenizers import Tokenizer

from orchestrator.structured.grammar.matcher import GrammarCache
from orchestrator.structured.guide import Guide, json_schema_guide
from orchestrator.structured.reasoning import ReasoningDelta, ReasoningSplitter, after_reasoning
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tool_parsers import ToolCallParser
from orchestrator.structured.tools import ToolDefinition, plan_tools
from orchestrator.structured.vocabulary import load_vocabulary
from orchestrator.text.detokenizer import IncrementalDetokenizer

from .synthetic import greedy_decode

R1_THINKING = "\nThe user wants a city and its population.\n\nParis has about 2.1 million people; I write </th as text.\n"
QWEN3_THINKING = "<think>\nOkay, one city as JSON. Let me pick Lyon.\n</think>\n\n"

# (opened_by_prompt, recorded output, expected reasoning, expected content)
RECORDED = [
    (
        True,
        R1_THINKING + '</think>\n\n{"city": "Paris", "population": 2100000}',
        R1_THINKING.strip(),
        '{"city": "Paris", "population": 2100000}',
    ),
    (True, "<think>\nThinking again.</think>The answer is 4.", "Thinking again.", "The answer is 4."),
    (True, "Still thinking when the tokens ran out <", "Still thinking when the tokens ran out <", ""),
    (False, QWEN3_THINKING + "Lyon.", "Okay, one city as JSON. Let me pick Lyon.", "Lyon."),
    (False, "  Just an answer, no <think> block.", "", "  Just an answer, no <think> block."),
    (False, "<thinking>is not the tag</thinking>", "", "<thinking>is not the tag</thinking>"),
    (False, "<think></think>\n\nEmpty thoughts.", "", "Empty thoughts."),
]


def split_all(splitter_args: dict, chunks: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter(**splitter_args)
    deltas = [splitter.feed(chunk) for chunk in chunks] + [splitter.finish()]
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


@pytest.mark.parametrize(("opened", "text", "reasoning", "content"), RECORDED)
def test_recorded_outputs_split_the_same_however_they_arrive(opened, text, reasoning, content):
    args = {"opened_by_prompt": opened}
    assert split_all(args, [text]) == (reasoning, content)
    assert split_all(args, list(text)) == (reasoning, content)
    for i in range(1, len(text)):
        assert split_all(args, [text[:i], text[i:]]) == (reasoning, content), i


def test_reasoning_streams_while_only_a_possible_end_tag_is_held():
    splitter = ReasoningSplitter(opened_by_prompt=True)
    assert splitter.feed("Let me see. </thi") == ReasoningDelta(reasoning="Let me see.")
    assert splitter.thinking
    assert splitter.feed("nk>\n") == ReasoningDelta()
    assert not splitter.thinking
    assert splitter.feed("Yes.") == ReasoningDelta(content="Yes.")


class City(BaseModel):
    city: str
    population: int


CITY = json_schema_guide(City.model_json_schema(), param="response_format.json_schema.schema")


@pytest.fixture(scope="module")
def cache(smollm2_dir: Path) -> GrammarCache:
    return GrammarCache(load_vocabulary(smollm2_dir))


def accepts(cache: GrammarCache, guide: Guide, text: str) -> bool:
    matcher = cache.new_state(guide)._matcher
    return matcher.accept_string(text) and matcher.accept_token(cache.vocabulary.stop_token_ids[0])


def test_the_constraint_begins_after_the_thinking_block(cache):
    r1 = after_reasoning(CITY, opened_by_prompt=True)
    qwen3 = after_reasoning(CITY, opened_by_prompt=False)
    answer = '{"city": "Paris", "population": 2100000}'
    assert r1.param == CITY.param and r1.kind == "structural_tag"
    assert accepts(cache, r1, R1_THINKING + "</think>\n\n" + answer)
    assert accepts(cache, qwen3, QWEN3_THINKING + answer)
    assert not accepts(cache, r1, answer)  # no answer before the thinking ends
    assert not accepts(cache, qwen3, answer)
    assert not accepts(cache, r1, "ok</think>Paris")  # and the answer is still constrained


def decode_after(smollm2_dir, cache, guide, recorded: str, seed: int) -> str:
    """Force the recorded thinking's tokens into the grammar, decode the rest with synthetic logits, and
    return the whole output's text."""
    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    forced = tokenizer.encode(recorded, add_special_tokens=False).ids
    state = cache.new_state(guide)
    assert state.advance(forced)
    _, ids = greedy_decode(smollm2_dir, cache, state, seed=seed)
    return IncrementalDetokenizer(tokenizer).push(forced + ids)


@pytest.mark.parametrize(
    ("opened", "recorded"), [(True, R1_THINKING + "</think>\n\n"), (False, QWEN3_THINKING)]
)
def test_a_structured_answer_after_recorded_thinking_validates(smollm2_dir, cache, opened, recorded):
    text = decode_after(smollm2_dir, cache, after_reasoning(CITY, opened_by_prompt=opened), recorded, seed=5)
    reasoning, content = split_all({"opened_by_prompt": opened}, [text])
    assert reasoning == recorded.replace("<think>", "").replace("</think>", "").strip()
    City.model_validate_json(content)


def test_forced_tool_calls_after_recorded_thinking_parse(smollm2_dir, cache):
    tools = [
        ToolDefinition.model_validate(
            {"type": "function", "function": {"name": "lookup", "parameters": City.model_json_schema()}}
        )
    ]
    fmt = TOOL_FORMATS["hermes"]
    guide = after_reasoning(
        tool_call_guide(plan_tools(tools, "required", False), fmt), opened_by_prompt=False
    )
    text = decode_after(smollm2_dir, cache, guide, QWEN3_THINKING, seed=6)
    _, content = split_all({"opened_by_prompt": False}, [text])
    parser = ToolCallParser(fmt, forced=True)
    parser.feed(content)
    parser.finish()
    assert [call.name for call in parser.calls] == ["lookup"]
    City.model_validate(json.loads(parser.calls[0].arguments))
