"""Through the real server on the test double: the model's `generation_logits` setting turns top_logprobs on for
that model alone (the HTTP side's check and the executor's configuration agree), the 400 of a model without it
names the setting, a request larger than the model's generation logits pool is refused naming its max tokens field
as each front door spells it (the pool shows in /admin/models), and a model whose guided decoding could not be set up at load serves unguided requests and
refuses guided ones with a 400 saying why."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.conftest import start_server
from tests.trtllm.conftest import double_env, make_trtllm_engine

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(default_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("model-settings")
    engines = root / "engines"
    for name in ("with-logits", "without-logits"):
        make_trtllm_engine(default_engine, engines, name)
    make_trtllm_engine(default_engine, engines, "unguided", plan={"guided_setup_error": "unreadable vocabulary"})
    settings = root / "models.toml"
    settings.write_text(f'[models.with-logits]\ngeneration_logits = true\ngeneration_logits_bytes = {POOL}\n')
    server = start_server(engines, root / "server.log", "--models", "with-logits,without-logits,unguided",
                          "--model-settings", str(settings), env=double_env())
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    client.admin_url = f"{server.base_url}/admin/models"
    yield client
    server.stop()


# Room for 5 tokens of one choice's fp32 logits, not 6: SmolLM2's 49,152-token vocabulary (its engine config.json's,
# on one GPU not padded further) is 196,608 bytes a token.
POOL = 1_048_576


def ask(client, model: str, **kwargs):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello there"}],
                                          max_tokens=3, temperature=0, **kwargs)


def test_top_logprobs_follow_the_models_setting(client):
    answer = ask(client, "with-logits", logprobs=True, top_logprobs=2)
    alternatives = [token.top_logprobs for token in answer.choices[0].logprobs.content]
    assert len(alternatives) == answer.usage.completion_tokens and all(len(a) == 2 for a in alternatives)
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, "without-logits", logprobs=True, top_logprobs=2)
    assert refused.value.body["param"] == "top_logprobs"
    assert "generation_logits setting" in refused.value.body["message"]


def test_a_failed_guided_setup_refuses_only_guided_requests(client):
    assert ask(client, "unguided").usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, "unguided", response_format={"type": "json_object"})
    assert "guided decoding could not be set up" in refused.value.body["message"]
    assert "unreadable vocabulary" in refused.value.body["message"]


@pytest.mark.parametrize(("api", "field"), [("chat", "max_completion_tokens"), ("chat", "max_tokens"),
                                            ("completions", "max_tokens"), ("responses", "max_output_tokens")])
def test_a_request_larger_than_the_logits_pool_is_refused_naming_its_field(client, api, field):
    with pytest.raises(openai.BadRequestError) as refused:
        if api == "chat":
            client.chat.completions.create(model="with-logits", messages=[{"role": "user", "content": "Hi"}],
                                           logprobs=True, top_logprobs=2, **{field: 6})
        elif api == "completions":
            client.completions.create(model="with-logits", prompt="Hi", logprobs=2, max_tokens=6)
        else:
            client.responses.create(model="with-logits", input="Hi", top_logprobs=2, max_output_tokens=6,
                                    include=["message.output_text.logprobs"])
    assert refused.value.body["param"] == field
    assert "ask for at most 5 tokens" in refused.value.body["message"]


def test_the_logits_pool_shows_in_admin_models_and_is_all_given_back(client):
    assert ask(client, "with-logits", logprobs=True, top_logprobs=2).usage.completion_tokens == 3
    with urllib.request.urlopen(client.admin_url, timeout=30) as response:
        models = {m["name"]: m for m in json.loads(response.read())["models"]}
    assert models["with-logits"]["generation_logits_pool"] == {"size_bytes": POOL, "used_bytes": 0}
    assert models["without-logits"]["generation_logits_pool"] is None


def test_a_request_without_max_tokens_is_refused_when_what_the_context_leaves_is_too_much(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="with-logits", messages=[{"role": "user", "content": "Hi"}],
                                       logprobs=True, top_logprobs=2)
    assert refused.value.body["param"] == "max_tokens"  # the field it did not give, in chat's older spelling
    assert "without max_tokens" in refused.value.body["message"]
