"""Wire validation and the one conversion into engine requests, on the real SmolLM2 engine folder."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from orchestrator.api.wire import ChatCompletionRequest, CompletionRequest, field_path
from orchestrator.engine.catalogue import discover
from orchestrator.engine.request import EngineRequest
from orchestrator.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine(default_engine):
    return discover(default_engine.parent, (default_engine.name,)).engines[default_engine.name]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "smollm2-135m", "messages": MESSAGES, **fields})


def test_chat_prompt_uses_the_models_template(engine):
    request = chat().to_inference_request(engine, "chatcmpl")
    prompt = engine.prompts.tokenizer.decode(list(request.choices[0].engine_request.prompt_ids), skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert request.prompt_tokens == len(request.choices[0].engine_request.prompt_ids)


def test_text_parts_are_joined(engine):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": " of France?"}]}]
    a = chat(messages=parts).to_inference_request(engine, "x").choices[0].engine_request.prompt_ids
    b = chat().to_inference_request(engine, "x").choices[0].engine_request.prompt_ids
    assert a == b


def test_defaults_come_from_the_manifest(engine):
    sampling = chat().to_inference_request(engine, "x").choices[0].engine_request.sampling
    defaults = engine.manifest.generation_defaults
    assert (sampling.temperature, sampling.top_p) == (defaults.temperature, defaults.top_p)


def test_max_tokens_default_fills_the_sequence(engine):
    request = chat().to_inference_request(engine, "x")
    engine_request = request.choices[0].engine_request
    assert engine_request.max_new_tokens + request.prompt_tokens == engine.manifest.limits.max_seq_len


def test_max_completion_tokens_is_the_newer_name_of_max_tokens(engine):
    request = chat(max_completion_tokens=7).to_inference_request(engine, "x")
    assert request.choices[0].engine_request.max_new_tokens == 7
    with pytest.raises(InvalidRequest, match="disagree"):  # neither wins silently
        chat(max_tokens=50, max_completion_tokens=7).to_inference_request(engine, "x")


def test_n_choices_share_the_prompt_and_get_distinct_ids_and_seeds(engine):
    request = chat(n=3, seed=5, stop="\n").to_inference_request(engine, "x")
    engine_requests = [c.engine_request for c in request.choices]
    assert len({r.id for r in engine_requests}) == 3
    assert len({r.prompt_ids for r in engine_requests}) == 1
    assert len({r.sampling.seed for r in engine_requests}) == 3
    assert all(r.stop == ("\n",) for r in engine_requests)


def test_a_given_seed_gives_the_same_sampling_seeds(engine):
    first = chat(seed=42, n=2).to_inference_request(engine, "x")
    second = chat(seed=42, n=2).to_inference_request(engine, "x")
    assert [c.engine_request.sampling.seed for c in first.choices] == [c.engine_request.sampling.seed for c in second.choices]


def test_engine_request_survives_the_wire(engine):
    original = chat(seed=1, stop=["a", "b"]).to_inference_request(engine, "x").choices[0].engine_request
    assert EngineRequest.from_wire(original.to_wire()) == original


def test_prompt_too_long(engine):
    with pytest.raises(ContextLengthExceeded, match="6144 tokens, but the prompt has 7001"):
        CompletionRequest(model="m", prompt="hello " * 7000).to_inference_request(engine, "x")


def test_max_tokens_too_large(engine):
    with pytest.raises(ContextLengthExceeded) as caught:
        chat(max_tokens=9000).to_inference_request(engine, "x")
    assert caught.value.param == "max_tokens"


def test_token_id_prompts_are_checked(engine):
    request = CompletionRequest(model="m", prompt=[1, 2, 3]).to_inference_request(engine, "x")
    assert request.choices[0].engine_request.prompt_ids == (1, 2, 3)
    with pytest.raises(InvalidRequest, match="token ids"):
        CompletionRequest(model="m", prompt=[10**9]).to_inference_request(engine, "x")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"suffix": "and then"}, "suffix"),
        ({"best_of": 3}, "best_of"),
    ],
)
def test_what_the_server_cannot_do_is_refused(engine, fields, param):
    with pytest.raises(UnsupportedParameter) as caught:
        CompletionRequest.model_validate({"model": "m", "prompt": "Hi", **fields}).to_inference_request(engine, "x")
    assert caught.value.param == param


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 3},
        {"top_p": 0},
        {"n": 0},
        {"n": 17},
        {"max_tokens": 0},
        {"stop": [""]},
        {"stop": ["s"] * 17},
        {"messages": []},
        {"unknown": 1},
    ],
)
def test_out_of_range_values_are_rejected(fields):
    with pytest.raises(ValidationError):
        chat(**fields)


def test_field_path_leaves_out_union_tags():
    assert field_path(("messages", 0, "content", "str"), ChatCompletionRequest) == "messages[0].content"
    assert field_path(("stop", "list[str]", 3), CompletionRequest) == "stop[3]"
    assert field_path(("tools", 0, "function", "parameters"), ChatCompletionRequest) == "tools[0].function.parameters"
    assert field_path(("stream_options", "continuous_usage_stats"), CompletionRequest) == (
        "stream_options.continuous_usage_stats")


# -- the system prefix (what retain_system_prompt keeps) -------------------------------------------------------------
def _retaining(engine, retain=True):
    """The same engine folder as a backend that keeps system prompts longer (trtllm), with the model's setting."""
    trtllm = engine.manifest.model_copy(update={"backend": "trtllm"})
    return replace(engine, manifest=trtllm, retain_system_prompt=retain)


def _prefix_and_prompt(engine, messages, **fields):
    request = chat(messages=messages, **fields).to_inference_request(engine, "x").choices[0].engine_request
    return request.system_prefix_tokens, request.prompt_ids


def test_system_prefix_covers_the_system_prompt_and_not_the_first_user_message(engine):
    retaining = _retaining(engine)
    system = {"role": "system", "content": "You are a careful agent. Keep answers short."}
    turn1 = [system, {"role": "user", "content": "Name a colour."}]
    turn2 = [*turn1, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one."}]
    count1, prompt1 = _prefix_and_prompt(retaining, turn1)
    count2, prompt2 = _prefix_and_prompt(retaining, turn2)
    text = engine.prompts.tokenizer.decode(list(prompt1[:count1]), skip_special_tokens=False)
    assert "careful agent" in text and "colour" not in text
    assert count1 == count2 > 0 and prompt1[:count1] == prompt2[:count2]  # every turn repeats the same tokens


def test_system_prefix_counts_tool_definitions(engine):
    retaining = _retaining(engine)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    user = [{"role": "user", "content": "Weather in Oslo?"}]
    count, prompt = _prefix_and_prompt(retaining, user, tools=tools)
    assert "get_weather" in engine.prompts.tokenizer.decode(list(prompt[:count]), skip_special_tokens=False)


def test_no_system_prefix_without_one_or_for_a_model_that_does_not_keep_it(engine):
    system = {"role": "system", "content": "You are a careful agent."}
    user = {"role": "user", "content": "Hi."}
    assert _prefix_and_prompt(_retaining(engine), [user])[0] == 0
    assert _prefix_and_prompt(_retaining(engine, retain=False), [system, user])[0] == 0  # the setting is off
    assert _prefix_and_prompt(replace(engine, retain_system_prompt=True), [system, user])[0] == 0  # llamacpp
