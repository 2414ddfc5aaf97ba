"""Kept responses through the official `openai` client against the real server on every backend: a five-turn
conversation continued by `previous_response_id` finds each earlier turn in the engine's prefix cache, a kept
response reads back as it was made and is deleted; and (on the embedded default) a conversation survives a
restart of the server."""

from __future__ import annotations

import itertools

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, start_server

pytestmark = pytest.mark.e2e

TURNS = ["Name a fruit.", "Name another.", "And a vegetable?", "Which is sweetest?", "Thanks!"]


def converse(client: openai.OpenAI, turns: list[str], previous: str | None = None) -> list:
    responses = []
    for text in turns:
        response = client.responses.create(model=DEFAULT_MODEL, input=text, previous_response_id=previous,
                                           max_output_tokens=12, temperature=0)
        responses.append(response)
        previous = response.id
    return responses


def test_each_turn_of_a_continued_conversation_reuses_the_earlier_turns_from_the_prefix_cache(client):
    responses = converse(client, TURNS)
    inputs = [r.usage.input_tokens for r in responses]
    cached = [r.usage.input_tokens_details.cached_tokens for r in responses]
    for before, after in itertools.pairwise(responses):  # each turn's prompt holds the one before and its answer
        assert after.usage.input_tokens > before.usage.input_tokens + before.usage.output_tokens - 2, inputs
    assert all(c < n for c, n in zip(cached, inputs, strict=True)), (inputs, cached)
    # found in whole cache blocks (llama.cpp: a token each; the hf backend: 64), so it grows as turns fill them
    assert cached == sorted(cached) and cached[-1] > 0, (inputs, cached)


def test_a_kept_response_reads_back_as_made_and_is_deleted(client):
    [made] = converse(client, TURNS[:1])
    assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


def test_a_conversation_survives_a_restart_of_the_server(backend, served_engine, tmp_path):
    if backend != "llamacpp":
        pytest.skip("one backend shows it: the store is the HTTP process's, the same for every backend")
    args = (served_engine.parent, tmp_path / "server.log", "--models", DEFAULT_MODEL, "--data-dir", str(tmp_path))
    server = start_server(*args)
    try:
        first = converse(openai.OpenAI(base_url=server.api, api_key="x", max_retries=0), TURNS[:2])
    finally:
        server.stop()
    server = start_server(*args)
    try:
        client = openai.OpenAI(base_url=server.api, api_key="x", max_retries=0)
        [later] = converse(client, TURNS[2:3], previous=first[-1].id)
        assert client.responses.retrieve(first[-1].id).model_dump() == first[-1].model_dump()
    finally:
        server.stop()
    assert later.previous_response_id == first[-1].id
    assert later.usage.input_tokens > first[-1].usage.input_tokens + first[-1].usage.output_tokens
