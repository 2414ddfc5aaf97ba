"""Through the real server on the test double: the model's `generation_logits` setting turns top_logprobs on for
that model alone (the HTTP side's check and the executor's configuration agree), the 400 of a model without it
names the setting, and a model whose guided decoding could not be set up at load serves unguided requests and
refuses guided ones with a 400 saying why."""

from __future__ import annotations

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
    settings.write_text('[models.with-logits]\ngeneration_logits = true\n')
    server = start_server(engines, root / "server.log", "--models", "with-logits,without-logits,unguided",
                          "--model-settings", str(settings), env=double_env())
    yield openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    server.stop()


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
