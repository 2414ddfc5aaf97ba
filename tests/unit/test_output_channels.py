"""A choice's text split into content, thinking and tool calls in the worker, on recorded outputs tokenised by the
real SmolLM2 tokenizer and fed as an engine would, a few tokens per step (no reasoning model runs here)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.structured.tool_formats import tool_format
from orchestrator.worker.channels import OutputChannels
from orchestrator.worker.outputs import SequenceOutput, TokenTexts

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(default_engine) -> Tokenizer:
    return Tokenizer.from_file(str(default_engine / "tokenizer.json"))


def run(tokenizer, text: str, *, reasoning: str | None, tool_calls: str, step: int, finish=FinishReason.STOP):
    request = EngineRequest("r", (1,), 500, tool_calls=tool_calls, reasoning=reasoning is not None)
    channels = OutputChannels(request, tool_format("hermes"), reasoning)
    output = SequenceOutput(request, tokenizer, TokenTexts(tokenizer), channels)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    deltas = []
    for start in range(0, len(ids), step):
        last = start + step >= len(ids)
        delta = output.on_delta(TokenDelta("r", ids[start : start + step], finish if last else None))
        if delta is not None:
            deltas.append(delta)
    return deltas


def joined(deltas, name: str) -> str:
    return "".join(getattr(d, name) or "" for d in deltas)


def calls(deltas) -> list[dict]:
    whole: list[dict] = []
    for entry in (e for d in deltas for e in d.tool_calls or ()):
        if entry["index"] == len(whole):
            whole.append({"id": entry["id"], "name": entry["function"]["name"], "arguments": ""})
        whole[entry["index"]]["arguments"] += entry["function"]["arguments"]
    return whole


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_qwen3_thinking_then_a_tool_call(tokenizer, step):
    deltas = run(tokenizer, "<think>\nThe user wants Paris weather.\n</think>\n\n" + CALL,
                 reasoning="qwen3", tool_calls="auto", step=step)
    assert joined(deltas, "reasoning").strip() == "The user wants Paris weather."
    assert joined(deltas, "text") == ""
    [call] = calls(deltas)
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert deltas[-1].finish is FinishReason.TOOL_CALLS


@pytest.mark.parametrize("step", [1, 4])
def test_deepseek_r1_thinking_opened_by_the_prompt_then_an_answer(tokenizer, step):
    deltas = run(tokenizer, "Two plus two.\n</think>\n\nIt is 4.", reasoning="deepseek_r1", tool_calls="", step=step)
    assert joined(deltas, "reasoning").strip() == "Two plus two."
    assert joined(deltas, "text") == "It is 4."
    assert deltas[-1].finish is FinishReason.STOP


def test_an_answer_that_is_not_a_call_stays_content_in_auto_mode(tokenizer):
    deltas = run(tokenizer, "The weather in Paris is mild <tool> today.", reasoning=None, tool_calls="auto", step=2)
    assert joined(deltas, "text") == "The weather in Paris is mild <tool> today."
    assert calls(deltas) == [] and deltas[-1].finish is FinishReason.STOP


def test_forced_calls_are_parsed_and_a_cut_answer_ends_with_length(tokenizer):
    deltas = run(tokenizer, CALL + "\n" + CALL.replace("Paris", "Rome"), reasoning=None, tool_calls="forced", step=5)
    assert [json.loads(c["arguments"])["city"] for c in calls(deltas)] == ["Paris", "Rome"]
    cut = run(tokenizer, CALL[:40], reasoning=None, tool_calls="forced", step=3, finish=FinishReason.LENGTH)
    assert cut[-1].finish is FinishReason.LENGTH  # a call cut short is not tool_calls


@pytest.mark.parametrize("step", [1, 3, 40])
def test_a_chunk_carries_at_most_one_entry_per_tool_call(tokenizer, step):
    """OpenAI never sends two delta.tool_calls entries for one index in one chunk (instructor's partial streaming
    reads the second as a new call): a call's header and its first argument fragments, arriving in the same step,
    are one entry."""
    deltas = run(tokenizer, CALL + "\n" + CALL.replace("Paris", "Rome"), reasoning=None, tool_calls="forced",
                 step=step)
    for delta in deltas:
        indexes = [entry["index"] for entry in delta.tool_calls or ()]
        assert len(indexes) == len(set(indexes)), delta.tool_calls
    assert [json.loads(c["arguments"])["city"] for c in calls(deltas)] == ["Paris", "Rome"]
