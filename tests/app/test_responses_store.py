"""The Responses API's kept responses in-process, on the real SQLite store in a temporary data directory, the
engine's output said by the test: `previous_response_id` continues the kept conversation (also after a restart,
with the same prompt as the whole conversation sent again), a response is read back whole or as its replayed
events, deleted, never seen by another key; `store: false` keeps nothing; `background: true` answers `queued` and
ends `completed` or `cancelled`."""

from __future__ import annotations

import asyncio

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from orchestrator.access.keys import hash_key
from orchestrator.engine.request import FinishReason
from tests.app.harness import bearer, keys_file_flags, named_events, running_app

EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture
def keys_flags(tmp_path):
    return keys_file_flags(tmp_path, "alice", "bob")


async def answer(app, body: dict, text: str = "Hello.", key: str = "sk-alice", finish=FinishReason.STOP):
    """POST /v1/responses; the engine says `text`. Returns the reply's status, its body and the engine request."""
    asking = asyncio.create_task(app.client.post("/v1/responses", json={"model": app.model, **body},
                                                 headers=bearer(key)))
    worker, request = await app.workers.next_submit()
    worker.emit(request.id, text, tokens=2, finish=finish)
    reply = await asking
    return reply.status, await reply.json(), request


def test_previous_response_id_continues_the_kept_conversation_across_a_restart(catalogue, keys_flags, tmp_path):
    flags = (*keys_flags, "--data-dir", str(tmp_path / "data"))

    async def go():
        async with running_app(catalogue, *flags) as app:
            _, first, _ = await answer(app, {"input": "Hi", "instructions": "Be brief."})
        async with running_app(catalogue, *flags) as app:  # a new server on the same data directory
            _, second, continued = await answer(app, {"input": "And then?", "previous_response_id": first["id"]})
            whole = [{"role": "user", "content": "Hi"}, *first["output"], {"role": "user", "content": "And then?"}]
            _, _, sent_whole = await answer(app, {"input": whole})
            gone = await app.client.post("/v1/responses", headers=bearer("sk-bob"), json={
                "model": app.model, "input": "x", "previous_response_id": first["id"]})
            return first, second, continued, sent_whole, gone.status, await gone.json()

    first, second, continued, sent_whole, gone_status, gone = asyncio.run(go())
    assert first["status"] == "completed" and first["store"] is True
    assert continued.prompt_ids == sent_whole.prompt_ids  # the instructions are not carried over, as OpenAI does
    assert second["previous_response_id"] == first["id"]
    assert gone_status == 404 and gone["error"]["param"] == "previous_response_id"


def test_a_kept_response_is_read_back_whole_and_as_its_events_then_deleted(catalogue, keys_flags, tmp_path):
    async def go():
        async with running_app(catalogue, *keys_flags, "--data-dir", str(tmp_path)) as app:
            _, made, _ = await answer(app, {"input": "Hi"}, "Hello there.")
            path = f"/v1/responses/{made['id']}"
            read = await (await app.client.get(path, headers=bearer("sk-alice"))).json()
            replay = await (await app.client.get(path + "?stream=true", headers=bearer("sk-alice"))).read()
            later = await (await app.client.get(path + "?stream=true&starting_after=3", headers=bearer("sk-alice"))).read()
            other = await app.client.get(path, headers=bearer("sk-bob"))
            other_delete = await app.client.delete(path, headers=bearer("sk-bob"))
            deleted = await (await app.client.delete(path, headers=bearer("sk-alice"))).json()
            after = await app.client.get(path, headers=bearer("sk-alice"))
            return made, read, replay, later, other.status, other_delete.status, deleted, after.status

    made, read, replay, later, other, other_delete, deleted, after = asyncio.run(go())
    assert read == made
    events = events_of(replay)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert events[-1].response.model_dump() == Response.model_validate(made).model_dump()
    assert [e.sequence_number for e in events_of(later, first=4)] == list(range(4, len(events)))
    assert (other, other_delete) == (404, 404)
    assert deleted == {"id": made["id"], "object": "response.deleted", "deleted": True} and after == 404


def test_store_false_keeps_nothing(catalogue, tmp_path):
    async def go():
        async with running_app(catalogue, "--data-dir", str(tmp_path)) as app:
            _, made, _ = await answer(app, {"input": "Hi", "store": False})
            return made, (await app.client.get(f"/v1/responses/{made['id']}")).status

    made, status = asyncio.run(go())
    assert made["store"] is False and status == 404


def test_a_background_response_is_queued_then_completed_and_holds_its_key_until_it_ends(catalogue, tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(f"""
        [keys.alice]
        key = "{hash_key('sk-alice')}"
        max_concurrent = 1
    """)

    async def go():
        async with running_app(catalogue, "--data-dir", str(tmp_path), "--auth.keys-file", str(keys)) as app:
            reply = await app.client.post("/v1/responses", headers=bearer("sk-alice"), json={
                "model": app.model, "input": "Hi", "background": True})
            queued = await reply.json()
            worker, request = await app.workers.next_submit()
            meanwhile = await app.client.post("/v1/responses", headers=bearer("sk-alice"), json={"model": app.model, "input": "x"})
            worker.emit(request.id, "Done.", tokens=2, finish=FinishReason.STOP)
            path = f"/v1/responses/{queued['id']}"
            for _ in range(200):
                polled = await (await app.client.get(path, headers=bearer("sk-alice"))).json()
                if polled["status"] == "completed":
                    break
                await asyncio.sleep(0.01)
            _, after, _ = await answer(app, {"input": "Hi"})
            return reply.status, queued, meanwhile.status, polled, after

    status, queued, meanwhile, polled, after = asyncio.run(go())
    assert status == 200 and queued["status"] == "queued" and queued["background"] is True
    assert meanwhile == 429  # the key's one concurrent request is the background response, until it ends
    response = Response.model_validate(polled)
    assert response.status == "completed" and response.background is True and response.output_text == "Done."
    assert response.id == queued["id"] and response.usage.output_tokens == 2
    assert after["status"] == "completed"


def test_a_cancelled_background_response_stops_its_engine_request_and_is_kept_cancelled(catalogue, tmp_path):
    async def go():
        async with running_app(catalogue, "--data-dir", str(tmp_path)) as app:
            queued = await (await app.client.post("/v1/responses", json={
                "model": app.model, "input": "Hi", "background": True})).json()
            worker, request = await app.workers.next_submit()
            worker.emit(request.id, "Still go", tokens=2)
            cancelled = await (await app.client.post(f"/v1/responses/{queued['id']}/cancel")).json()
            kept = await (await app.client.get(f"/v1/responses/{queued['id']}")).json()
            _, plain, _ = await answer(app, {"input": "Hi"})
            not_background = await app.client.post(f"/v1/responses/{plain['id']}/cancel")
            return cancelled, kept, worker.cancelled, request.id, not_background.status

    cancelled, kept, engine_cancels, engine_id, not_background = asyncio.run(go())
    assert cancelled["status"] == "cancelled" and kept == cancelled
    assert engine_cancels == [engine_id]
    assert not_background == 400


def test_the_fields_that_need_the_store_are_refused_by_name_without_one(catalogue, tmp_path):
    async def go():
        async with running_app(catalogue, "--no-store.enabled") as app:
            replies = []
            for field, value in (("previous_response_id", "resp_x"), ("background", True)):
                reply = await app.client.post("/v1/responses", json={"model": app.model, "input": "Hi",
                                                                     field: value})
                replies.append((field, reply.status, (await reply.json())["error"]["param"]))
            background_unkept = await app.client.post("/v1/responses", json={
                "model": app.model, "input": "Hi", "background": True, "store": False})
            return replies, background_unkept.status, (await background_unkept.json())["error"]["param"]

    replies, status, param = asyncio.run(go())
    assert replies == [("previous_response_id", 400, "previous_response_id"), ("background", 400, "background")]
    assert (status, param) == (400, "store")


def events_of(raw: bytes, first: int = 0) -> list:
    events = [EVENT.validate_python(p) for p in named_events(raw)]
    assert [e.sequence_number for e in events] == list(range(first, first + len(events)))
    return events
