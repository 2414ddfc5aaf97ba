"""The fields real clients send beyond OpenAI's, honoured by the real server on the real SmolLM2 model (every
backend of the conformance suite), through the official `openai` client and, for benchmark clients, the exact bodies they send (read from their
source: ../shared/reference/openai-clients.md). Each test would fail if its field were ignored."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, metric

pytestmark = pytest.mark.e2e

HI = [{"role": "user", "content": "Say hi"}]  # SmolLM2 answers in a few dozen tokens, then ends


@pytest.fixture(scope="module")
def natural(client):
    """The greedy answer to HI and how many tokens it takes before the model ends it."""
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=200)
    assert reply.choices[0].finish_reason == "stop", "premise: the model ends its greedy answer to HI by itself"
    return reply.choices[0].message.content, reply.usage.completion_tokens


def post(server, path: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{server.base_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def sse_events(raw: bytes) -> list[dict]:
    events = [line[len(b"data: "):] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return [json.loads(event) for event in events[:-1]]


# -- how sequences end ----------------------------------------------------------------------------------------------
def test_ignore_eos_generates_exactly_max_tokens(client, natural):
    _, length = natural
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=length + 8,
                                           extra_body={"ignore_eos": True})
    assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (length + 8, "length")


def test_nvext_carries_ignore_eos_as_aiperf_sends_it(client, natural):
    _, length = natural
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=length + 4,
                                           extra_body={"nvext": {"ignore_eos": True}})
    assert reply.usage.completion_tokens == length + 4


def test_min_tokens_holds_back_the_end_token(client, natural):
    _, length = natural
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=length + 40,
                                           extra_body={"min_tokens": length + 6})
    assert reply.usage.completion_tokens >= length + 6


def test_min_tokens_holds_back_stop_strings(client, natural):
    text, _ = natural
    stop = text[: text.index(" ")]  # the answer's first word: a stop string that hits at once
    early = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, stop=[stop])
    assert early.choices[0].message.content == "" and early.choices[0].finish_reason == "stop"
    late = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0, stop=[stop],
                                          extra_body={"min_tokens": 3})
    assert late.choices[0].message.content.startswith(stop)


def test_stop_token_ids_end_the_answer_at_that_token(server, client, natural):
    text, _ = natural
    tokens = json.loads(post(server, "/tokenize", {"model": DEFAULT_MODEL, "prompt": text,
                                                   "add_special_tokens": False})[1])["tokens"]
    stop_token = tokens[4]
    before = tokens[: tokens.index(stop_token)]
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=0,
                                           extra_body={"stop_token_ids": [stop_token]})
    assert reply.choices[0].finish_reason == "stop"
    expected = json.loads(post(server, "/detokenize", {"model": DEFAULT_MODEL, "tokens": before})[1])["prompt"]
    assert reply.choices[0].message.content == expected  # the stop token ends the answer and is not part of it
    assert reply.usage.completion_tokens < natural[1]


def test_include_stop_str_in_output_keeps_the_stop_string(client):
    def complete(**extra):
        return client.completions.create(model=DEFAULT_MODEL, prompt="The capital of France is", temperature=0,
                                         max_tokens=10, extra_body={"ignore_eos": True, **extra}).choices[0]

    text = complete().text
    stop = text.strip()[-2:]  # two characters the answer ends with: they occur in it, however it is worded
    plain, kept = complete(stop=[stop]), complete(stop=[stop], include_stop_str_in_output=True)
    assert plain.finish_reason == kept.finish_reason == "stop"
    assert kept.text == plain.text + stop


def test_output_constraints_are_honoured_or_refused_by_name(client, features):
    """Backends without guided decoding (the simulator) refuse a constraint with a 400 naming it; the others follow
    it (test_structured_outputs.py)."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    reply = refused_unless_honoured(features.guided, "response_format.json_schema.schema",
                                    lambda: client.chat.completions.create(
        model=DEFAULT_MODEL, messages=HI, max_tokens=60, response_format={
            "type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}))
    assert reply is None or json.loads(reply.choices[0].message.content)["ok"] in (True, False)


def test_completions_default_to_16_tokens_as_openai_does(client):
    reply = client.completions.create(model=DEFAULT_MODEL, prompt="Once upon a time", temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 16


# -- how tokens are chosen ------------------------------------------------------------------------------------------
def test_logit_bias_of_100_forces_a_token(server, client, features):
    banana = json.loads(post(server, "/tokenize", {"model": DEFAULT_MODEL, "prompt": " banana",
                                                   "add_special_tokens": False})[1])["tokens"]
    assert len(banana) == 1
    reply = refused_unless_honoured(features.logit_bias, "logit_bias", lambda: client.completions.create(
        model=DEFAULT_MODEL, prompt="The capital of France is", temperature=0, max_tokens=4,
        logit_bias={str(banana[0]): 100}))
    assert reply is None or reply.choices[0].text == " banana" * 4


def test_a_logit_bias_of_minus_100_bans_the_greedy_choice(server, client, features):
    if not features.logit_bias:
        pytest.skip("this backend refuses logit_bias (test_logit_bias_of_100_forces_a_token checks the 400)")
    def first(**bias) -> str:
        return client.completions.create(model=DEFAULT_MODEL, prompt="The capital of France is", temperature=0,
                                          max_tokens=1, **bias).choices[0].text

    chosen = first()
    [token] = json.loads(post(server, "/tokenize", {"model": DEFAULT_MODEL, "prompt": chosen,
                                                    "add_special_tokens": False})[1])["tokens"]
    assert first(logit_bias={str(token): -100}) != chosen


def test_penalties_are_honoured_or_refused_by_name(client, features):
    for field, value in (("repetition_penalty", 2.0), ("presence_penalty", 0.5), ("frequency_penalty", 0.5)):
        reply = refused_unless_honoured(features.penalties, field, lambda f=field, v=value: client.completions.create(
            model=DEFAULT_MODEL, prompt="one two one two", temperature=0, max_tokens=4, extra_body={f: v}))
        assert reply is None or reply.usage.completion_tokens == 4


def test_repetition_penalty_changes_the_greedy_answer_and_one_changes_nothing(client, a_real_model):
    def complete(**extra):
        return client.completions.create(model=DEFAULT_MODEL, prompt="one two one two one two", temperature=0,
                                         max_tokens=12, extra_body=extra).choices[0].text

    plain = complete()
    assert complete(repetition_penalty=1.0) == plain
    assert complete(repetition_penalty=2.0) != plain


def test_min_p_of_one_keeps_only_the_most_likely_token(client, natural, a_real_model):
    text, _ = natural
    sampled = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, temperature=1.5, seed=7,
                                             max_tokens=200, extra_body={"min_p": 1.0})
    assert sampled.choices[0].message.content == text  # nothing but the argmax survives: the greedy answer


def refused_unless_honoured(honoured: bool, param: str, call):
    """The reply where the backend honours the field; where it does not, a 400 naming it (then None)."""
    if honoured:
        return call()
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.body["param"] == param
    return None


def test_top_logprobs_list_distinct_tokens_best_first_starting_with_the_greedy_choice(client, features, a_real_model):
    reply = refused_unless_honoured(features.top_logprobs, "top_logprobs", lambda: client.chat.completions.create(
        model=DEFAULT_MODEL, messages=HI, temperature=0, max_tokens=6, logprobs=True, top_logprobs=5))
    if reply is None:
        return
    content = reply.choices[0].logprobs.content
    assert len(content) == 6
    for position in content:
        alternatives = position.top_logprobs
        assert len(alternatives) == 5 and len({a.token for a in alternatives}) == 5
        values = [a.logprob for a in alternatives]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert alternatives[0].token == position.token and alternatives[0].logprob == pytest.approx(position.logprob)


def test_top_logprobs_at_the_default_sampling_are_the_models_distribution(client, features):
    """Sampled at the model's default temperature and top_p, the alternatives are still the model's: exactly
    top_logprobs of them, the least likely below 0 (truncated sampling gave one alternative at log probability 0)."""
    reply = refused_unless_honoured(features.top_logprobs, "top_logprobs", lambda: client.chat.completions.create(
        model=DEFAULT_MODEL, messages=HI, max_tokens=6, logprobs=True, top_logprobs=3, seed=3))
    if reply is None:
        return
    for position in reply.choices[0].logprobs.content:
        alternatives = position.top_logprobs
        assert len(alternatives) == 3 and len({a.token for a in alternatives}) == 3
        assert alternatives[-1].logprob < 0 and position.logprob <= 0
        same = [a.logprob for a in alternatives if a.token == position.token]
        assert not same or same[0] == pytest.approx(position.logprob)


def test_completions_logprobs_give_alternatives_by_text(client, features):
    reply = refused_unless_honoured(features.top_logprobs, "logprobs", lambda: client.completions.create(
        model=DEFAULT_MODEL, prompt="The capital of France is", temperature=0, max_tokens=3, logprobs=2))
    if reply is None:
        return
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert all(len(top) >= 2 and token in top for token, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True))


def test_echo_puts_the_prompt_first(client):
    reply = client.completions.create(model=DEFAULT_MODEL, prompt="The capital of France is", temperature=0,
                                      max_tokens=3, echo=True)
    assert reply.choices[0].text.startswith("The capital of France is")
    assert len(reply.choices[0].text) > len("The capital of France is")


def test_echo_with_logprobs_is_refused_naming_why(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=1, echo=True, logprobs=1)
    assert caught.value.body["param"] == "echo"


# -- streaming usage, templates, tokenizing -----------------------------------------------------------------------
def test_continuous_usage_stats_put_usage_on_every_chunk(server):
    status, raw = post(server, "/v1/completions", {
        "model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    })
    assert status == 200
    events = sse_events(raw)
    counts = [event["usage"]["completion_tokens"] for event in events]
    assert counts == sorted(counts) and counts[-1] == 5
    assert all(event["usage"]["prompt_tokens"] == events[0]["usage"]["prompt_tokens"] for event in events)


def test_chat_template_kwargs_reach_the_template_and_reserved_names_are_refused(client):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, max_tokens=1,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, max_tokens=1,
                                       extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert "chat_template_kwargs" in caught.value.body["param"]


def test_tokenize_and_detokenize_as_vllm_shapes_them(server, client, limits):
    status, raw = post(server, "/tokenize", {"model": DEFAULT_MODEL, "messages": HI})
    assert status == 200
    answer = json.loads(raw)
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, max_tokens=1)
    assert answer["count"] == len(answer["tokens"]) == reply.usage.prompt_tokens
    [served] = [m for m in client.models.list().data if m.id == DEFAULT_MODEL]
    assert answer["max_model_len"] == served.model_extra["max_model_len"] == limits.max_seq_len
    status, raw = post(server, "/detokenize", {"model": DEFAULT_MODEL, "tokens": answer["tokens"]})
    assert status == 200 and json.loads(raw)["prompt"].endswith("Say hi<|im_end|>\n<|im_start|>assistant\n")


def test_unknown_fields_are_still_refused_by_name(server):
    status, raw = post(server, "/v1/completions", {"model": DEFAULT_MODEL, "prompt": "Hi", "guided_json": {}})
    assert status == 400 and json.loads(raw)["error"]["param"] == "guided_json"
    status, raw = post(server, "/v1/completions", {"model": DEFAULT_MODEL, "prompt": "Hi", "nvext": {"greed": 1}})
    assert status == 400 and json.loads(raw)["error"]["param"] == "nvext.greed"


# -- benchmark clients' bodies, as their source sends them ------------------------------------------------------------
def _streamed_completion_tokens(raw: bytes) -> int:
    return sse_events(raw)[-1]["usage"]["completion_tokens"]


@pytest.mark.parametrize("client_name, path, body", [
    ("vllm bench serve, completions", "/v1/completions", {
        "model": DEFAULT_MODEL, "prompt": "Tell me about the sea.", "repetition_penalty": 1.0, "max_tokens": 24,
        "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}),
    ("vllm bench serve, chat", "/v1/chat/completions", {
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
        "max_completion_tokens": 24, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}),
    ("guidellm, completions", "/v1/completions", {
        "model": DEFAULT_MODEL, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": 24, "stop": None, "ignore_eos": True, "prompt": "Tell me about the sea."}),
    ("guidellm, chat", "/v1/chat/completions", {
        "model": DEFAULT_MODEL, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": 24, "stop": None, "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]}),
    ("aiperf, chat fixed length", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hi"}], "model": DEFAULT_MODEL, "stream": True,
        "max_completion_tokens": 24, "ignore_eos": True, "min_tokens": 24, "stream_options": {"include_usage": True}}),
])
def test_benchmark_clients_bodies_get_exactly_max_tokens(server, client_name, path, body):
    status, raw = post(server, path, body)
    assert status == 200, f"{client_name}: {raw[:300]!r}"
    assert _streamed_completion_tokens(raw) == 24


# -- the prefix cache ---------------------------------------------------------------------------------------------
LEDGER = ("Ledger of the lighthouse keeper on the northern cape, kept through the winter of the great storms. "
          "Each entry records the wind, the sea, the ships that passed, the state of the lamp and the oil burned. ") * 6


def test_a_shared_prompt_prefix_is_reported_as_cached_tokens(server, client, backend):
    """usage.prompt_tokens_details.cached_tokens from the engine's prefix cache: none for a new prompt; for one
    that shares a long prefix with it, the whole blocks of that prefix; for a prompt seen before in full, its
    whole blocks but never its last token, which the engine always computes again. The block is what the engine
    reports in inferno_kv_cache_tokens_per_block (hf: its page; llamacpp: one token, it reuses any prefix)."""
    if backend == "trtllm":
        pytest.skip("TensorRT-LLM also reuses a partly matching block: tests/trtllm/test_api.py has its own version")
    nonce = f"Entry {uuid.uuid4().hex}. "  # a prefix no earlier request of this server has shared
    first_prompt = nonce + LEDGER + "Which entry tells of the worst storm?"
    second_prompt = nonce + LEDGER + ("Name the ship that passed on the longest night, the cargo it carried, the port "
                                      "it sailed from, the wind it met, and whether the keeper's lamp showed it the "
                                      "rocks in time; then say how much oil burned that night and who kept the watch.")
    first_ids, second_ids = (json.loads(post(server, "/tokenize", {"model": DEFAULT_MODEL, "prompt": p})[1])["tokens"]
                             for p in (first_prompt, second_prompt))
    shared = next(i for i, (a, b) in enumerate(zip(first_ids, second_ids, strict=False)) if a != b)
    reused_before = metric(server.base_url, "inferno_kv_cache_reused_blocks_total", model=DEFAULT_MODEL)
    # Each request goes on past its first token: transformers 5.23 registers a prompt's blocks for sharing only
    # then (a request that ends on its first token leaves none behind; docs/api.md says so).
    go_on = {"ignore_eos": True}
    first = client.completions.create(model=DEFAULT_MODEL, prompt=first_prompt, temperature=0, max_tokens=4,
                                      extra_body=go_on)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    block = int(metric(server.base_url, "inferno_kv_cache_tokens_per_block", model=DEFAULT_MODEL))
    # the test's premise: several blocks shared, and the prompts part at least one whole block before the end
    assert block >= 1 and shared >= 3 * block and shared // block < (len(second_ids) - 1) // block

    chunks = list(client.completions.create(model=DEFAULT_MODEL, prompt=second_prompt, temperature=0, max_tokens=4,
                                            stream=True, stream_options={"include_usage": True}, extra_body=go_on))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == shared // block * block

    again = client.completions.create(model=DEFAULT_MODEL, prompt=second_prompt, temperature=0, max_tokens=4,
                                      extra_body=go_on)
    assert again.usage.prompt_tokens_details.cached_tokens == (len(second_ids) - 1) // block * block
    reused = metric(server.base_url, "inferno_kv_cache_reused_blocks_total", model=DEFAULT_MODEL) - reused_before
    assert reused == shared // block + (len(second_ids) - 1) // block
