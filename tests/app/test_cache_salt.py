"""The prefix cache salt every engine request carries, in-process: one per key by default, so no key reuses (or
learns of) another key's prompts; a request's own `cache_salt` shares with every request naming the same salt,
through each front door; a server without keys keeps one salt for everyone."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from orchestrator.engine.request import FinishReason
from tests.app.harness import bearer, keys_file_flags, running_app

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def keys_flags(tmp_path):
    return keys_file_flags(tmp_path, "alice", "bob")


async def salt_of(app, path: str, body: dict, headers: dict) -> str:
    """The cache salt of the engine request one request to `path` makes (its engine answers at once)."""
    asking = asyncio.create_task(app.client.post(path, json={"model": app.model, **body}, headers=headers))
    worker, request = await app.workers.next_submit()
    worker.emit(request.id, "Hello", tokens=1, finish=FinishReason.STOP)
    response = await asking
    assert response.status == 200, await response.text()
    return request.cache_salt


def chat(**extra) -> dict:
    return {"messages": HI, "max_tokens": 4, **extra}


def test_each_key_has_its_own_salt_and_a_request_may_name_one_to_share(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            post = "/v1/chat/completions"
            return [await salt_of(app, post, chat(), bearer("sk-alice")),
                    await salt_of(app, post, chat(), bearer("sk-alice")),
                    await salt_of(app, post, chat(), bearer("sk-bob")),
                    await salt_of(app, post, chat(cache_salt="team"), bearer("sk-alice")),
                    await salt_of(app, post, chat(cache_salt="team"), bearer("sk-bob")),
                    await salt_of(app, "/v1/completions", {"prompt": "Hi", "max_tokens": 4}, bearer("sk-bob")),
                    await salt_of(app, "/v1/responses", {"input": "Hi", "cache_salt": "team"}, bearer("sk-bob")),
                    await salt_of(app, "/v1/messages", {"messages": HI, "max_tokens": 4, "cache_salt": "team"},
                                  {"x-api-key": "sk-alice"})]

    alice, alice_again, bob, alice_team, bob_team, bob_text, responses_team, messages_team = asyncio.run(go())
    assert alice == alice_again and bob == bob_text and alice != bob
    assert alice_team == bob_team == responses_team == messages_team
    assert alice_team not in (alice, bob) and "" not in (alice, bob, alice_team)
    assert "alice" not in alice and "team" not in alice_team  # a digest: it tells nothing of what it was made from


def test_without_keys_every_caller_shares_one_salt(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            return (await salt_of(app, "/v1/chat/completions", chat(), {}),
                    await salt_of(app, "/v1/chat/completions", chat(cache_salt="mine"), {}))

    shared, own = asyncio.run(go())
    assert shared == "" and own not in ("", "mine")


@pytest.mark.parametrize("salt", ["", "x" * 257, 7])
def test_a_bad_cache_salt_is_refused_naming_the_field(catalogue, salt):
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.post("/v1/chat/completions",
                                             json={"model": app.model, **chat(cache_salt=salt)})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 400 and body["error"]["param"] == "cache_salt"


def test_a_keys_long_prompt_pieces_are_tokenised_once_for_that_key_only(catalogue, keys_flags):
    """The segment cache (text/segments.py) through the server: the second turn of a conversation finds the
    first turn's segments for the same key, another key finds none, and every prompt has the ids the tokenizer
    gives it whole. The catalogue (and its cache) is the session's: the system prompt is new to it, and what each
    request found is counted from just before it."""
    system = {"role": "system", "content": f"Session {uuid.uuid4()}. " + "You answer in one short sentence. " * 60}
    turn_one = [system, {"role": "user", "content": "Tell me about the rain on a tin roof. " * 20}]
    turn_two = [*turn_one, {"role": "assistant", "content": "It drums."}, {"role": "user", "content": "Why?"}]

    async def prompt_of(app, messages, key):
        cache = catalogue.engines[app.model].prompts.segments
        found_before = cache.hit_tokens
        asking = asyncio.create_task(app.client.post("/v1/chat/completions", headers=bearer(key), json={
            "model": app.model, "messages": messages, "max_tokens": 4}))
        worker, request = await app.workers.next_submit()
        worker.emit(request.id, "Hello", tokens=1, finish=FinishReason.STOP)
        assert (await asking).status == 200
        return list(request.prompt_ids), cache.hit_tokens - found_before

    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            encoder = catalogue.engines[app.model].prompts
            expected = [encoder.tokenizer.encode(encoder.render_chat(m), add_special_tokens=False).ids
                        for m in (turn_one, turn_two)]
            return expected, [await prompt_of(app, turn_one, "sk-alice"), await prompt_of(app, turn_two, "sk-alice"),
                              await prompt_of(app, turn_two, "sk-bob")]

    expected, ((alice_one, found_one), (alice_two, found_two), (bob_two, found_bob)) = asyncio.run(go())
    assert alice_one == expected[0] and alice_two == bob_two == expected[1]
    assert found_one == 0 and found_two > 400  # alice's second turn found her system prompt and first message
    assert found_bob == 0  # bob found nothing of alice's
