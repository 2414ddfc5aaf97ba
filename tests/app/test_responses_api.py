"""`POST /v1/responses` in-process, the engine's output said step by step by the test: a reasoning model's thinking
as a reasoning item (whole and streamed), a failure after the stream began as `response.failed`, and API keys,
usage and the audit log applying as they do to chat."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from orchestrator.access.keys import hash_key
from orchestrator.engine.request import FinishReason
from orchestrator.errors import EngineError
from orchestrator.ipc.messages import TextDelta
from tests.app.harness import bearer, named_events, running_app, say

EVENT = TypeAdapter(ResponseStreamEvent)


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


async def ask(app, stream: bool, key: str = "sk-insider"):
    return asyncio.create_task(app.client.post(
        "/v1/responses", json={"model": app.model, "input": "Why?", "stream": stream}, headers=bearer(key)))


def events_of(raw: bytes) -> list:
    """The stream's events, each typed by the SDK, numbered 0, 1, 2..."""
    events = [EVENT.validate_python(p) for p in named_events(raw)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


async def think_then_answer(app, stream: bool):
    asking = await ask(app, stream)
    worker, request = await app.workers.next_submit()
    say(worker, request.id, reasoning="Because ", tokens=2)
    say(worker, request.id, reasoning="it is.", tokens=2)
    say(worker, request.id, "It ", tokens=1)
    say(worker, request.id, "is.", tokens=1, finish=FinishReason.STOP)
    return await asking


def test_thinking_is_a_reasoning_item_before_the_message_whole_and_streamed(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            whole = await (await think_then_answer(app, stream=False)).json()
            streamed = await (await think_then_answer(app, stream=True)).read()
            return whole, streamed

    whole, raw = asyncio.run(go())
    response = Response.model_validate(whole)
    reasoning, _message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert [c.text for c in reasoning.content] == ["Because it is."] and reasoning.summary == []
    assert response.output_text == "It is." and response.usage.output_tokens == 6
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    events = events_of(raw)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Because it is." and final.output_text == "It is."
    assert events[6].text == "Because it is." and events[13].text == "It is."
    assert final.usage.model_dump() == response.usage.model_dump()


def test_an_engine_failure_after_the_stream_began_ends_it_with_response_failed(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            asking = await ask(app, stream=True)
            worker, request = await app.workers.next_submit()
            say(worker, request.id, "Half")
            await asyncio.sleep(0)
            worker.emit(request.id, error=EngineError("the engine stopped"))
            return await (await asking).read()

    events = events_of(asyncio.run(go()))
    assert events[-1].type == "response.failed" and events[-1].response.status == "failed"
    assert events[-1].response.error.code == "server_error" and "the engine stopped" in events[-1].response.error.message
    assert [e.type for e in events].count("response.output_item.done") == 1
    assert events[-2].item.status == "incomplete"


def test_keys_usage_and_the_audit_log_apply_as_on_chat(catalogue, keys_flags, tmp_path):
    audit_file = tmp_path / "audit.jsonl"

    async def go():
        async with running_app(catalogue, *keys_flags, "--audit.file", str(audit_file)) as app:
            hidden = await (await ask(app, stream=False, key="sk-outsider"))
            asking = await ask(app, stream=False)
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Hello there", tokens=3, finish=FinishReason.STOP)
            answer = await asking
            usage = await (await app.client.get("/admin/usage", headers=bearer("sk-ops"))).json()
            return hidden.status, await hidden.json(), answer.status, request, usage, app.model

    hidden_status, hidden, status, request, usage, model = asyncio.run(go())
    assert (hidden_status, hidden["error"]["code"]) == (404, "model_not_found") and status == 200
    insider = usage["keys"]["insider"]
    assert list(insider["models"]) == [model] and insider["total"]["requests"] == 1
    assert insider["total"]["completion_tokens"] == 3 and insider["total"]["prompt_tokens"] == len(request.prompt_ids)
    lines = [orjson.loads(line) for line in audit_file.read_text().splitlines()]
    responses = [line for line in lines if line["path"] == "/v1/responses"]
    assert [(line["key"], line["status"]) for line in responses] == [("outsider", 404), ("insider", 200)]
    assert responses[1]["model"] == model and responses[1]["completion_tokens"] == 3


def test_a_call_of_a_namespaced_function_is_a_function_call_item_naming_its_namespace(catalogue):
    tools = [{"type": "namespace", "name": "agents", "description": "Agents",
              "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}]}]

    async def go(stream: bool):
        async with running_app(catalogue) as app:
            asking = asyncio.create_task(app.client.post("/v1/responses", json={
                "model": app.model, "input": "Spawn one.", "tools": tools, "stream": stream}))
            worker, request = await app.workers.next_submit()
            sink = worker.sinks[request.id]
            opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "spawn", "arguments": ""}}
            sink(TextDelta(request.id, "", 2, tool_calls=[opening]).to_wire())
            sink(TextDelta(request.id, "", 2, FinishReason.TOOL_CALLS,
                           tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]).to_wire())
            reply = await asking
            return await reply.read()

    whole = Response.model_validate_json(asyncio.run(go(stream=False)))
    [call] = whole.output
    assert (call.type, call.name, call.namespace, call.call_id, call.arguments) == (
        "function_call", "spawn", "agents", "call_1", "{}")
    events = events_of(asyncio.run(go(stream=True)))
    assert [e.type for e in events[2:]] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[-1].response.output[0].namespace == "agents" and events[-3].arguments == "{}"
