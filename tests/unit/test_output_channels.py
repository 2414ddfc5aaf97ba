"""A choice's text split into content, thinking and tool calls in the worker, on recorded outputs tokenised by the
real SmolLM2 tokenizer and fed as an engine would, a few tokens per step (no reasoning model runs here); and a
repeated call ending the request in the engine, through the worker's own step path."""

from __future__ import annotations

import json
import threading

import pytest
from tokenizers import Tokenizer

from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.ipc.messages import TextDelta, decode_from_worker
from orchestrator.structured.tool_formats import tool_format
from orchestrator.worker.channels import OutputChannels
from orchestrator.worker.main import Worker
from orchestrator.worker.outputs import SequenceOutput, TokenTexts

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
ROME = CALL.replace("Paris", "Rome")


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


@pytest.mark.parametrize("step", [1, 3, 40])
def test_a_call_that_repeats_an_earlier_one_ends_the_sequence_with_tool_calls(tokenizer, step):
    """The engine would go on (no finish of its own): the sequence ends where the repeat's object closes, the
    repeat is not sent, and what the engine writes after it is not read."""
    text = CALL + "\n" + ROME + "\n" + ROME.replace("celsius", "fahrenheit").replace("Rome", "Paris") + "\n"
    text += CALL.replace('"city": "Paris", "unit": "celsius"', '"unit":"celsius","city":"Paris"') + "\n" + ROME
    deltas = run(tokenizer, text, reasoning=None, tool_calls="forced", step=step, finish=None)
    assert [json.loads(c["arguments"]) for c in calls(deltas)] == [
        {"city": "Paris", "unit": "celsius"}, {"city": "Rome", "unit": "celsius"},
        {"city": "Paris", "unit": "fahrenheit"}]
    assert deltas[-1].finish is FinishReason.TOOL_CALLS
    assert [d.finish for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert joined(deltas, "text") == ""


@pytest.mark.parametrize("step", [1, 4])
def test_a_call_cut_by_max_tokens_is_not_sent_and_the_finish_says_length(tokenizer, step):
    for cut in (15, 40, len(ROME) - 14):
        deltas = run(tokenizer, CALL + "\n" + ROME[:cut], reasoning=None, tool_calls="forced", step=step,
                     finish=FinishReason.LENGTH)
        assert [json.loads(c["arguments"])["city"] for c in calls(deltas)] == ["Paris"]
        assert deltas[-1].finish is FinishReason.LENGTH and joined(deltas, "text") == ""


@pytest.mark.parametrize("step", [1, 3])
def test_each_streamed_call_comes_whole_in_one_entry(tokenizer, step):
    deltas = run(tokenizer, CALL + "\n" + ROME, reasoning=None, tool_calls="auto", step=step)
    entries = [entry for d in deltas for entry in d.tool_calls or ()]
    assert [(e["index"], e["function"]["name"]) for e in entries] == [(0, "get_weather"), (1, "get_weather")]
    assert [json.loads(e["function"]["arguments"])["city"] for e in entries] == ["Paris", "Rome"]


class RecordingBackend:
    def __init__(self):
        self.cancelled: list[str] = []

    def submit(self, request):
        pass

    def cancel(self, request_id):
        self.cancelled.append(request_id)


class RecordingChannel:
    def __init__(self):
        self.frames: list[dict] = []

    def send(self, frame):
        self.frames.append(frame)


def test_the_worker_ends_the_request_in_the_engine_at_a_repeated_call(tokenizer):
    """As for a stop string: the engine is told to cancel, its later tokens are dropped, the row says tool_calls."""
    backend, channel = RecordingBackend(), RecordingChannel()
    worker = Worker(channel, backend, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
    worker._submit(EngineRequest("r", (1,), 500, tool_calls="forced"))
    ids = tokenizer.encode(CALL + "\n" + CALL + "\n" + ROME, add_special_tokens=False).ids
    for start in range(0, len(ids), 5):
        worker.step([TokenDelta("r", ids[start : start + 5])])
    rows = [TextDelta.from_wire(row) for frame in channel.frames for row in decode_from_worker(frame).rows]
    assert backend.cancelled == ["r"]
    assert rows[-1].finish is FinishReason.TOOL_CALLS
    assert [json.loads(c["arguments"])["city"] for c in calls(rows)] == ["Paris"]


class DeliveringBackend(RecordingBackend):
    """An engine whose own thread answers before `submit` has returned, as the llamacpp engine thread can."""

    def __init__(self):
        super().__init__()
        self.outputs = None

    def submit(self, request):
        final = TokenDelta(request.id, [42], FinishReason.LENGTH)
        done = threading.Thread(target=self.outputs.step, args=([final],))
        done.start()
        done.join()


def test_a_step_delivered_from_the_engine_thread_before_submit_returns_is_sent(tokenizer):
    backend, channel = DeliveringBackend(), RecordingChannel()
    worker = Worker(channel, backend, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
    backend.outputs = worker
    worker._submit(EngineRequest("r", (1,), 1))
    rows = [TextDelta.from_wire(row) for frame in channel.frames for row in decode_from_worker(frame).rows]
    assert [(row.request_id, row.num_tokens, row.finish) for row in rows] == [("r", 1, FinishReason.LENGTH)]
    assert worker.any_thread
