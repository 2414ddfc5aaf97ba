"""The OpenAI contract on a trtllm engine, through the official client, the real server and its real worker.

What is particular to TensorRT-LLM (the rest of the OpenAI contract runs on the double in tests/conformance).
Runs twice: on the test double of TensorRT-LLM's bindings with a generated engine folder, and on the real
TensorRT-LLM with an engine built by `make build-engine` where it is installed (skipped elsewhere). The
expectations hold for any model; those that depend on what the double generates are marked so.
"""

from __future__ import annotations

import json

import openai
import pytest

from orchestrator.text.prompt import PromptEncoder
from tests.conftest import metric, scrape, wait_for

pytestmark = pytest.mark.e2e

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
STORY = "Once upon a time, in a land far away, there lived a dragon who"


@pytest.fixture(scope="module")
def client(trt_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=trt_server.api, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def double_only(trt_server):
    if not trt_server.double:
        pytest.skip("expects what the test double generates")


def _complete(client, trt_server, **kwargs):
    return client.completions.create(model=trt_server.model, prompt=STORY, temperature=0, **kwargs)


def _text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# -- answers ----------------------------------------------------------------------------------------------------
def test_chat_completion(client, trt_server):
    reply = client.chat.completions.create(model=trt_server.model, messages=CAPITAL, temperature=0, max_tokens=64)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.model == trt_server.model and reply.object == "chat.completion"
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_the_doubles_answer_arrives_token_for_token(client, trt_server, double_only):
    """The double repeats the prompt up to its first end token; every token must reach the client once, in order,
    and the end token must end the answer (finish_reason stop) without being part of it."""
    prompts = PromptEncoder(trt_server.folder)
    prompt = prompts.encode_chat(CAPITAL)
    end = prompt.index(2)  # SmolLM2's end token, <|im_end|>, closes the system message
    reply = client.chat.completions.create(model=trt_server.model, messages=CAPITAL, temperature=0, max_tokens=200)
    assert reply.choices[0].message.content == prompts.tokenizer.decode(prompt[:end])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == end


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("pick", ["inside the text", "a whole word"])
def test_a_stop_string_ends_the_answer_and_is_left_out(client, trt_server, stream, pick):
    full = _complete(client, trt_server, max_tokens=40).choices[0].text
    words = full.split()
    stop = full[len(full) // 2 : len(full) // 2 + 3] if pick == "inside the text" else " " + words[len(words) // 2]
    assert stop.strip() and stop in full, full
    kwargs = dict(max_tokens=40, stop=[stop])
    if stream:
        chunks = list(client.completions.create(model=trt_server.model, prompt=STORY, temperature=0, stream=True,
                                                **kwargs))
        text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        reply = _complete(client, trt_server, **kwargs)
        text, finish = reply.choices[0].text, reply.choices[0].finish_reason
    assert (text, finish) == (full[: full.index(stop)], "stop")


def test_n_choices(client, trt_server):
    reply = client.chat.completions.create(model=trt_server.model, messages=CAPITAL, n=3, temperature=1.0,
                                           max_tokens=12, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    assert reply.usage.completion_tokens >= 3
    assert len({c.message.content for c in reply.choices}) > 1  # each choice samples with its own seed


def test_penalties_are_honoured_by_this_backend(client, trt_server):
    reply = _complete(client, trt_server, max_tokens=8, presence_penalty=0.5, frequency_penalty=0.5)
    assert reply.choices[0].finish_reason == "length"


# -- cached prompt tokens ---------------------------------------------------------------------------------------
LEDGER = ("Ledger of the lighthouse keeper on the northern cape, kept through the winter of the great storms. "
          "Each entry records the wind, the sea, the ships that passed, the state of the lamp and the oil burned. ") * 4


def _shared_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_a_shared_prompt_prefix_is_reported_as_cached_tokens(client, trt_server):
    """The engine's prefix cache, through usage.prompt_tokens_details.cached_tokens: none for a new prompt; for
    one that shares a long prefix with it, whole blocks of that prefix (the last one possibly matched only in
    part); for a prompt seen before in full, all but its last token, which the engine always computes again."""
    first_prompt = LEDGER + "Which entry tells of the worst storm?"
    second_prompt = LEDGER + "Name the ship that passed on the longest night, the cargo it carried and its port."
    encode = PromptEncoder(trt_server.folder).encode_text
    shared = _shared_prefix(encode(first_prompt), encode(second_prompt))
    config = json.loads((trt_server.folder / "config.json").read_text())
    block = config["build_config"]["plugin_config"]["tokens_per_block"]
    assert shared >= 3 * block  # the test's premise: a prefix of several blocks

    first = client.completions.create(model=trt_server.model, prompt=first_prompt, temperature=0, max_tokens=4)
    assert first.usage.prompt_tokens_details.cached_tokens == 0

    chunks = list(client.completions.create(model=trt_server.model, prompt=second_prompt, temperature=0,
                                            max_tokens=4, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    cached = usage.prompt_tokens_details.cached_tokens
    whole_blocks = -(-shared // block) * block
    assert whole_blocks < usage.prompt_tokens - 1  # the test's premise: the prompts part well before the end
    assert shared // block * block <= cached <= whole_blocks
    if trt_server.double:  # partial reuse: the block the prompts part in counts whole
        assert cached == whole_blocks and cached % block == 0

    again = client.completions.create(model=trt_server.model, prompt=second_prompt, temperature=0, max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


# -- log probabilities ------------------------------------------------------------------------------------------
def test_chat_logprobs_cover_every_token_of_the_answer(client, trt_server):
    reply = client.chat.completions.create(
        model=trt_server.model, messages=CAPITAL, temperature=0, max_tokens=12, logprobs=True
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    assert all(entry.logprob <= 0 and entry.top_logprobs == [] for entry in content)
    assert all(bytes(entry.bytes).decode() == entry.token for entry in content)


def test_streamed_chat_logprobs_arrive_with_their_tokens(client, trt_server):
    chunks = list(client.chat.completions.create(
        model=trt_server.model, messages=CAPITAL, temperature=0, max_tokens=12, logprobs=True, stream=True
    ))
    tokens = [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert "".join(tokens) == _text(chunks)


def test_text_completion_logprobs_in_the_legacy_shape(client, trt_server):
    reply = _complete(client, trt_server, max_tokens=6, logprobs=0)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset[1] == len(logprobs.tokens[0])


def test_alternative_tokens_are_refused_clearly(client, trt_server):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=trt_server.model, messages=CAPITAL, logprobs=True, top_logprobs=3)
    assert caught.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        _complete(client, trt_server, max_tokens=2, logprobs=2)
    assert caught.value.body["param"] == "logprobs"


# -- cancellation -----------------------------------------------------------------------------------------------
def _idle(trt_server) -> bool:
    samples = scrape(trt_server.base_url)
    return all(
        samples.get((name, (("model", trt_server.model),)), 0) == 0
        for name in ("inferno_requests_running", "inferno_engine_requests_running", "inferno_engine_requests_waiting")
    )


def _cancelled(trt_server) -> float:
    labels = dict(model=trt_server.model, status_class="4xx", finish_reason="cancelled")
    return metric(trt_server.base_url, "inferno_requests_total", **labels)


def _iterations(trt_server) -> float:
    return metric(trt_server.base_url, "inferno_engine_iterations", model=trt_server.model)


LONG = 4000  # tokens a cancelled request would have gone on generating


def test_closing_a_stream_cancels_the_request_in_the_engine(client, trt_server):
    wait_for(lambda: _idle(trt_server), what="an idle server")
    before, steps = _cancelled(trt_server), _iterations(trt_server)
    stream = client.completions.create(model=trt_server.model, prompt=STORY, max_tokens=LONG, stream=True)
    for received, _ in enumerate(stream):
        if received == 3:
            break
    assert metric(trt_server.base_url, "inferno_engine_requests_running", model=trt_server.model) == 1
    stream.close()
    wait_for(lambda: _cancelled(trt_server) == before + 1, what="the request to be recorded as cancelled")
    wait_for(lambda: _idle(trt_server), what="the engine to drop the request")
    assert _iterations(trt_server) - steps < LONG  # dropped by the engine, not run to max_tokens


def test_a_non_streaming_client_that_gives_up_is_cancelled(trt_server):
    wait_for(lambda: _idle(trt_server), what="an idle server")
    before, steps = _cancelled(trt_server), _iterations(trt_server)
    impatient = openai.OpenAI(base_url=trt_server.api, api_key="unused", max_retries=0, timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model=trt_server.model, prompt=STORY, max_tokens=LONG)
    wait_for(lambda: _cancelled(trt_server) == before + 1, what="the request to be recorded as cancelled")
    wait_for(lambda: _idle(trt_server), what="the engine to drop the request")
    assert _iterations(trt_server) - steps < LONG


# -- engine stats -----------------------------------------------------------------------------------------------
def _blocks(trt_server, kind: str) -> float:
    return metric(trt_server.base_url, "inferno_kv_cache_blocks", model=trt_server.model, kind=kind)


def test_kv_cache_stats_follow_the_assigned_budget(trt_server):
    wait_for(lambda: _idle(trt_server), what="an idle server")
    manifest = json.loads((trt_server.folder / "engine.json").read_text())
    per_block = metric(trt_server.base_url, "inferno_kv_cache_tokens_per_block", model=trt_server.model)
    config = json.loads((trt_server.folder / "config.json").read_text())
    assert per_block == config["build_config"]["plugin_config"]["tokens_per_block"]
    total = _blocks(trt_server, "total")
    budget_blocks = manifest["kv_cache"]["default_budget_bytes"] // (manifest["kv_cache"]["bytes_per_token"] * per_block)
    assert 0 < total <= budget_blocks  # never more than the budget, whatever the engine rounds
    if trt_server.double:
        assert total == budget_blocks
    assert _blocks(trt_server, "free") + _blocks(trt_server, "used") == total


def test_a_running_request_shows_in_the_engine_gauges(client, trt_server):
    wait_for(lambda: _idle(trt_server), what="an idle server")
    iterations = _iterations(trt_server)
    stream = client.completions.create(model=trt_server.model, prompt=STORY, max_tokens=LONG, stream=True)
    for received, _ in enumerate(stream):
        if received == 3:
            break
    samples = scrape(trt_server.base_url)
    model = (("model", trt_server.model),)
    assert samples[("inferno_engine_requests_running", model)] == 1
    assert samples[("inferno_kv_cache_blocks", (("kind", "used"), *model))] >= 1
    assert samples[("inferno_kv_cache_usage_ratio", model)] > 0
    assert samples[("inferno_engine_iterations", model)] > iterations
    stream.close()
    wait_for(lambda: _idle(trt_server), what="the engine to drop the request")
    assert metric(trt_server.base_url, "inferno_kv_cache_usage_ratio", model=trt_server.model) == 0
