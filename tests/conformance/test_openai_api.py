"""The OpenAI contract, through the official `openai` client, against the real server on every backend.

What a model says depends on the machine (llama.cpp's quantised matmuls take other paths on other CPUs): these
tests check properties of the answers, and compare answers with one another within the same run."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, metric, wait_for

pytestmark = pytest.mark.e2e

CAPITAL = [{"role": "user", "content": "Which city is the capital of France?"}]
HI = [{"role": "user", "content": "Say hi"}]
NATURAL_MAX = 200  # room enough for the model to end its answer to HI by itself


def streamed_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def assert_finish_agrees_with_usage(finish_reason: str, completion_tokens: int, max_tokens: int) -> None:
    """`length` exactly when the answer used all of max_tokens; `stop` only before that."""
    assert finish_reason in ("stop", "length")
    assert (finish_reason == "length") == (completion_tokens == max_tokens), (finish_reason, completion_tokens)


# -- happy paths ----------------------------------------------------------------------------------------------
def test_chat_answers_with_the_openai_shape(client):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=NATURAL_MAX)
    choice = reply.choices[0]
    assert choice.message.content and choice.message.role == "assistant"
    assert_finish_agrees_with_usage(choice.finish_reason, reply.usage.completion_tokens, NATURAL_MAX)
    assert reply.object == "chat.completion"
    assert reply.model == DEFAULT_MODEL
    assert reply.id.startswith("chatcmpl-")
    assert reply.usage.prompt_tokens > 5
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_text_completion(client):
    reply = client.completions.create(model=DEFAULT_MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert reply.object == "text_completion"
    assert reply.choices[0].text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5


def test_chat_stream_has_role_first_then_content_then_finish(client):
    stream = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, stream=True,
                                            max_tokens=NATURAL_MAX)
    chunks = list(stream)
    first, last = chunks[0], chunks[-1]
    assert first.choices[0].delta.role == "assistant"
    assert last.choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    whole = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=NATURAL_MAX)
    assert streamed_text(chunks) == whole.choices[0].message.content
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)  # no usage unless asked for


def test_stream_equals_non_stream_for_greedy(client):
    whole = client.chat.completions.create(model=DEFAULT_MODEL, messages=CAPITAL, temperature=0, max_tokens=24)
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=CAPITAL, temperature=0, max_tokens=24, stream=True
    )
    assert streamed_text(stream) == whole.choices[0].message.content


def test_include_usage_adds_a_final_usage_chunk(client):
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=HI, temperature=0, stream=True, max_tokens=NATURAL_MAX,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    generated = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert usage.completion_tokens >= generated > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert_finish_agrees_with_usage(chunks[-2].choices[0].finish_reason, usage.completion_tokens, NATURAL_MAX)
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_equals_the_whole_completion(client):
    kwargs = dict(model=DEFAULT_MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    chunks = list(client.completions.create(stream=True, **kwargs))
    whole = client.completions.create(**kwargs)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text != ""
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_longer_greedy_answer_continues_the_shorter_one(client):
    """Greedy decoding is a prefix-consistent continuation: asking for more tokens extends the same answer."""
    def complete(n):
        return client.completions.create(model=DEFAULT_MODEL, prompt="Once upon a time", max_tokens=n, temperature=0,
                                         extra_body={"ignore_eos": True})

    short, long = complete(6), complete(18)
    assert (short.usage.completion_tokens, long.usage.completion_tokens) == (6, 18)
    assert long.choices[0].text.startswith(short.choices[0].text) and len(long.choices[0].text) > len(short.choices[0].text)


def test_list_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [DEFAULT_MODEL]
    assert client.models.retrieve(DEFAULT_MODEL).id == DEFAULT_MODEL


def test_health_and_ready(server):
    for path in ("/health", "/ready"):
        with urllib.request.urlopen(f"{server.base_url}{path}", timeout=10) as response:
            assert response.status == 200
    with urllib.request.urlopen(f"{server.base_url}/ready", timeout=10) as response:
        assert json.loads(response.read())["models"] == {DEFAULT_MODEL: "ready"}


# -- parameters -----------------------------------------------------------------------------------------------
def test_max_tokens_gives_finish_reason_length(client):
    reply = client.chat.completions.create(  # ignore_eos: no backend's answer may end sooner (a sampled end token)
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Tell me a long story."}], max_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_max_completion_tokens_is_honoured(client):
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Tell me a long story."}], max_completion_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 4


COUNT = [{"role": "user", "content": "Count from 1 to 10, one number per line."}]


def stop_string_in(text: str) -> tuple[str, int]:
    """A two-character stop string from the second half of `text`, and where it first occurs: output stopped by
    it must be exactly text[:where], whatever the model said."""
    for where in range(len(text) // 2, len(text) - 1):
        candidate = text[where:where + 2]
        if candidate.strip() and text.find(candidate) == where:
            return candidate, where
    raise AssertionError(f"no stop string to pick from {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_output_and_is_not_included(client, stream):
    unstopped = client.chat.completions.create(model=DEFAULT_MODEL, messages=COUNT, temperature=0, max_tokens=60,
                                               extra_body={"ignore_eos": True})
    full = unstopped.choices[0].message.content
    stop, where = stop_string_in(full)
    kwargs = dict(model=DEFAULT_MODEL, messages=COUNT, temperature=0, max_tokens=60, stop=[stop],
                  extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = streamed_text(chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        reply = client.chat.completions.create(**kwargs)
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert finish == "stop"
    assert text == full[:where] and stop not in text


def test_stop_as_a_single_string(client):
    kwargs = dict(model=DEFAULT_MODEL, prompt="1, 2, 3, 4, 5, 6,", max_tokens=20, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    stop, where = stop_string_in(full)
    reply = client.completions.create(stop=stop, **kwargs)
    assert reply.choices[0].text == full[:where]
    assert reply.choices[0].finish_reason == "stop"


def test_n_choices_carry_their_index(client):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=CAPITAL, n=2, temperature=1.0, max_tokens=12,
                                           seed=5)
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.content for c in reply.choices)


def test_n_choices_when_streaming(client):
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=CAPITAL, n=2, max_tokens=8, stream=True, stream_options={"include_usage": True},
        seed=5,
    )
    texts = {0: "", 1: ""}
    finishes = {}
    roles = set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.delta.role:
                roles.add(choice.index)
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        if chunk.usage:
            usage = chunk.usage
    assert roles == {0, 1}
    assert set(finishes) == {0, 1}
    assert all(texts.values())
    assert usage.completion_tokens >= 2


def _sampled(client, seed, **extra):
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Invent a name for a pet dragon."}],
        temperature=1.0,
        max_tokens=16,
        seed=seed,
        **extra,
    )
    return [c.message.content for c in reply.choices]


def test_same_seed_same_output(client):
    assert _sampled(client, 1234) == _sampled(client, 1234)


def test_different_seeds_differ(client):
    outputs = {tuple(_sampled(client, seed)) for seed in (1, 2, 3, 4)}
    assert len(outputs) > 1


def test_seeded_output_does_not_depend_on_other_requests(server, client):
    alone = _sampled(client, 99)

    async def together():
        async_client = openai.AsyncOpenAI(base_url=server.api, api_key="unused", max_retries=0)
        noise = [
            async_client.chat.completions.create(
                model=DEFAULT_MODEL, messages=CAPITAL, temperature=1.0, max_tokens=16
            )
            for _ in range(3)
        ]
        target = async_client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": "Invent a name for a pet dragon."}],
            temperature=1.0,
            max_tokens=16,
            seed=99,
        )
        results = await asyncio.gather(target, *noise)
        return [c.message.content for c in results[0].choices]

    assert asyncio.run(together()) == alone


def test_seeded_choices_differ_from_each_other(client):
    first, second = _sampled(client, 7, n=2)
    assert first != second


def test_user_field_is_accepted(client):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=CAPITAL, max_tokens=2, user="alice", seed=5)
    assert reply.choices[0].message.content


def sixteen_streams(server, messages: list[dict], **extra) -> list[tuple[str, str | None]]:
    """Sixteen greedy chat streams of `messages` at once: each one's (text, finish_reason)."""
    async def one(client):
        stream = await client.chat.completions.create(
            model=DEFAULT_MODEL, messages=messages, temperature=0, stream=True, **extra
        )
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def burst():
        client = openai.AsyncOpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
        return await asyncio.gather(*(one(client) for _ in range(16)))

    return asyncio.run(burst())


def test_sixteen_concurrent_streams_all_complete_alike(server):
    results = sixteen_streams(server, HI, max_tokens=32)
    assert len(results) == 16
    assert len(set(results)) == 1  # same prompt, greedy: the same answer and ending in one batch
    text, finish = results[0]
    assert text and finish in ("stop", "length")


# -- errors ---------------------------------------------------------------------------------------------------
def test_prompt_too_long_says_both_numbers(client, limits):
    words = limits.max_input_len + 1  # a token or more each: longer than the engine takes, whatever its limit
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=DEFAULT_MODEL, prompt="hello " * words, max_tokens=1)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert f"is {limits.max_input_len} tokens" in error["message"]
    has = re.search(r"the prompt has (\d+) tokens", error["message"])
    assert has and int(has[1]) > limits.max_input_len, error["message"]


def test_max_tokens_beyond_the_engine_is_a_400(client, limits):
    asked = limits.max_seq_len + 1
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=CAPITAL, max_tokens=asked)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "max_tokens"
    assert str(asked) in error["message"] and f"is {limits.max_seq_len} tokens" in error["message"]


# -- cancellation ---------------------------------------------------------------------------------------------
def _idle(server) -> bool:
    return (
        metric(server.base_url, "inferno_requests_running", model=DEFAULT_MODEL) == 0
        and metric(server.base_url, "inferno_engine_requests_running", model=DEFAULT_MODEL) == 0
        and metric(server.base_url, "inferno_engine_requests_waiting", model=DEFAULT_MODEL) == 0
    )


def _cancelled(server) -> float:
    labels = dict(model=DEFAULT_MODEL, status_class="4xx", finish_reason="cancelled")
    return metric(server.base_url, "inferno_requests_total", **labels)


def test_closing_a_stream_cancels_the_request_in_the_engine(server, client):
    wait_for(lambda: _idle(server), what="an idle server")
    before = _cancelled(server)
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        max_tokens=1000,
        extra_body={"ignore_eos": True},  # long on every backend, whatever the model would say
        stream=True,
    )
    for received, _ in enumerate(stream):
        if received == 3:
            break
    assert metric(server.base_url, "inferno_engine_requests_running", model=DEFAULT_MODEL) == 1
    stream.close()
    wait_for(lambda: _cancelled(server) == before + 1, what="the request to be recorded as cancelled")
    wait_for(lambda: _idle(server), timeout=10, what="the engine to drop the request")


def test_a_non_streaming_client_that_times_out_is_cancelled(server):
    wait_for(lambda: _idle(server), what="an idle server")
    before = _cancelled(server)
    impatient = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(  # no max_tokens: all the context leaves, on any engine's speed
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
            extra_body={"ignore_eos": True},
        )
    wait_for(lambda: _cancelled(server) == before + 1, what="the request to be recorded as cancelled")
    wait_for(lambda: _idle(server), timeout=10, what="the engine to drop the request")
