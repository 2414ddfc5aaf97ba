"""`POST /v1/messages` in-process, the engine's output said step by step by the test: thinking as a thinking block
with a signature (whole and streamed, as the `anthropic` SDK types them), tool calls as tool_use blocks, a failure
after the stream began as an `error` event, and API keys (`x-api-key` too), usage and the audit log applying as
they do to chat."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from orchestrator.access.keys import hash_key
from orchestrator.engine.request import FinishReason
from orchestrator.errors import EngineError
from tests.app.harness import named_events, running_app, say

EVENT = TypeAdapter(RawMessageStreamEvent)
BODY = {"max_tokens": 64, "messages": [{"role": "user", "content": "Why?"}]}


@pytest.fixture
def keys_flags(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(f"""
        [keys.insider]
        key = "{hash_key('sk-insider')}"
        [keys.outsider]
        key = "{hash_key('sk-outsider')}"
        models = ["some-other-model"]
        [keys.ops]
        key = "{hash_key('sk-ops')}"
        admin = true
    """)
    return "--auth.keys-file", str(path)


async def ask(app, stream: bool, headers: dict | None = None, **fields):
    return asyncio.create_task(app.client.post(
        "/v1/messages?beta=true", json={"model": app.model, **BODY, "stream": stream, **fields},
        headers={"anthropic-version": "2023-06-01", **(headers or {})}))


def events_of(raw: bytes) -> list:
    """The stream's events, each typed by the SDK (error and ping events as dicts)."""
    return [p if p["type"] in ("error", "ping") else EVENT.validate_python(p) for p in named_events(raw)]


async def think_then_answer(app, stream: bool):
    asking = await ask(app, stream)
    worker, request = await app.workers.next_submit()
    say(worker, request.id, reasoning="Because ", tokens=2)
    say(worker, request.id, reasoning="it is.", tokens=2)
    say(worker, request.id, "It ", tokens=1)
    say(worker, request.id, "is.", tokens=1, finish=FinishReason.STOP)
    return await asking


def test_thinking_is_a_signed_thinking_block_before_the_text_whole_and_streamed(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            whole = await (await think_then_answer(app, stream=False)).json()
            streamed = await (await think_then_answer(app, stream=True)).read()
            return whole, streamed

    whole, raw = asyncio.run(go())
    message = Message.model_validate(whole)
    thinking, text = message.content
    assert (thinking.type, thinking.thinking, text.type, text.text) == ("thinking", "Because it is.", "text", "It is.")
    assert thinking.signature and message.stop_reason == "end_turn" and message.usage.output_tokens == 6
    events = events_of(raw)
    types = [e["type"] if isinstance(e, dict) else e.type for e in events]
    assert types == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[5].delta.type == "signature_delta" and events[5].delta.signature == thinking.signature
    assert [e.index for e in events[2:7]] == [0] * 5 and [e.index for e in events[7:11]] == [1] * 4
    assert events[-2].usage.output_tokens == 6 and events[-2].delta.stop_reason == "end_turn"


def test_a_tool_call_is_a_tool_use_block_with_an_object_input(catalogue):
    opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "spawn", "arguments": ""}}
    tools = [{"name": "spawn", "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}]

    async def go(stream: bool):
        async with running_app(catalogue) as app:
            asking = await ask(app, stream, tools=tools)
            worker, request = await app.workers.next_submit()
            say(worker, request.id, tokens=2, tool_calls=[opening])
            say(worker, request.id, tokens=2, finish=FinishReason.TOOL_CALLS,
                tool_calls=[{"index": 0, "function": {"arguments": '{"n": 2}'}}])
            return await (await asking).read()

    message = Message.model_validate_json(asyncio.run(go(stream=False)))
    [call] = message.content
    assert (call.type, call.id, call.name, call.input, message.stop_reason) == (
        "tool_use", "call_1", "spawn", {"n": 2}, "tool_use")
    events = events_of(asyncio.run(go(stream=True)))
    assert events[2].content_block.type == "tool_use" and events[2].content_block.input == {}
    assert events[3].delta.type == "input_json_delta" and events[3].delta.partial_json == '{"n": 2}'
    assert events[-2].delta.stop_reason == "tool_use"


def test_an_engine_failure_after_the_stream_began_is_an_error_event(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            asking = await ask(app, stream=True)
            worker, request = await app.workers.next_submit()
            say(worker, request.id, "Half")
            await asyncio.sleep(0)
            worker.emit(request.id, error=EngineError("the engine stopped"))
            return await (await asking).read()

    events = events_of(asyncio.run(go()))
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "api_error"
    assert "the engine stopped" in events[-1]["error"]["message"]


def test_keys_usage_and_the_audit_log_apply_as_on_chat(catalogue, keys_flags, tmp_path):
    audit_file = tmp_path / "audit.jsonl"

    async def go():
        async with running_app(catalogue, *keys_flags, "--audit.file", str(audit_file)) as app:
            missing = await (await ask(app, stream=False))
            hidden = await (await ask(app, stream=False, headers={"x-api-key": "sk-outsider"}))
            asking = await ask(app, stream=False, headers={"x-api-key": "sk-insider"})
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Hello there", tokens=3, finish=FinishReason.STOP)
            answer = await asking
            usage = await (await app.client.get("/admin/usage", headers={"x-api-key": "sk-ops"})).json()
            return (missing.status, await missing.json(), hidden.status, await hidden.json(), answer.status, request,
                    usage, app.model)

    missing_status, missing, hidden_status, hidden, status, request, usage, model = asyncio.run(go())
    assert missing_status == 401 and missing["type"] == "error"
    assert missing["error"]["type"] == "authentication_error"
    assert (hidden_status, hidden["error"]["type"]) == (404, "not_found_error") and status == 200
    insider = usage["keys"]["insider"]
    assert list(insider["models"]) == [model] and insider["total"]["requests"] == 1
    assert insider["total"]["completion_tokens"] == 3 and insider["total"]["prompt_tokens"] == len(request.prompt_ids)
    lines = [orjson.loads(line) for line in audit_file.read_text().splitlines()]
    messages = [line for line in lines if line["path"] == "/v1/messages"]
    assert [(line["key"], line["status"]) for line in messages] == [(None, 401), ("outsider", 404), ("insider", 200)]
    assert messages[2]["model"] == model and messages[2]["completion_tokens"] == 3
