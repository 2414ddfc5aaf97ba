"""The Messages stream's tool_use blocks carry the same input a whole message gives, whatever the model wrote."""

from __future__ import annotations

import json

import pytest

from orchestrator.api.messages_api.output import content_blocks
from orchestrator.api.messages_api.presenter import MessagesPresenter
from orchestrator.api.messages_api.wire import MessagesRequest
from orchestrator.ipc.messages import TextDelta
from orchestrator.lifecycle import Choice


def streamed_input(arguments: str) -> object:
    """The input a client builds from the stream's input_json_delta fragments of one call."""
    presenter = MessagesPresenter(MessagesRequest(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]))
    entry = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    events = presenter.delta(None, None, TextDelta("r.0", "", 1, tool_calls=[entry]))  # type: ignore[arg-type]
    starts = [e for name, e in events if name == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"]
    fragments = [e["delta"]["partial_json"] for name, e in events
                 if name == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
    return json.loads("".join(fragments) or "{}")


def whole_input(arguments: str) -> object:
    choice = Choice(0, None)  # type: ignore[arg-type]
    choice.tool_calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}]
    return content_blocks(choice, "")[-1]["input"]


@pytest.mark.parametrize("arguments", ['{"city": "Paris", "days": [1, 2]}', '"a string"', "[1, 2]",
                                       '{"parameters": {"type": "object"', "not json at all"])
def test_streamed_input_equals_the_whole_message_input(arguments):
    assert streamed_input(arguments) == whole_input(arguments)
    assert isinstance(streamed_input(arguments), dict)
