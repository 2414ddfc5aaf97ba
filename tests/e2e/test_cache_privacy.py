"""The prefix cache is private to each key on the real server, through the official `openai` client, on the hf
and llamacpp backends: the same prompt sent by a second key reports no cached tokens, the same key again does,
and two keys that name the same `cache_salt` share on purpose."""

from __future__ import annotations

import openai
import pytest

from orchestrator.access.keys import hash_key
from tests.conftest import DEFAULT_MODEL, copy_engine, start_server

pytestmark = pytest.mark.e2e

STORY = ("Once upon a time, in a village between two rivers, a baker, a smith and a weaver argued every evening "
         "about whose craft mattered most to the village. ")


@pytest.fixture(scope="module", params=["hf", "llamacpp"])
def keyed_server(request, tmp_path_factory):
    engine = request.getfixturevalue("default_engine" if request.param == "hf" else "gguf_engine")
    folder = tmp_path_factory.mktemp(f"private-{request.param}")
    copy_engine(engine, folder / "engines", DEFAULT_MODEL)
    keys = folder / "keys.toml"
    keys.write_text("".join(f'[keys.{name}]\nkey = "{hash_key("sk-" + name)}"\n' for name in ("alice", "bob", "carol")))
    server = start_server(folder / "engines", folder / "server.log", "--models", DEFAULT_MODEL,
                          env={"INFERNO_AUTH__KEYS_FILE": str(keys)})
    yield server
    server.stop()


def cached(server, key: str, text: str, **extra) -> int:
    reply = openai.OpenAI(base_url=server.api, api_key=key, max_retries=0, timeout=120).chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": text}], max_tokens=2, temperature=0, **extra)
    details = reply.usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def test_a_key_never_reuses_another_keys_prompt(keyed_server):
    text = STORY * 4 + "Who won the argument?"
    first = cached(keyed_server, "sk-alice", text)
    other_key = cached(keyed_server, "sk-bob", text)
    same_key = cached(keyed_server, "sk-alice", text)
    assert first == 0 and other_key == 0 and same_key > 0


def test_keys_naming_the_same_cache_salt_share_on_purpose(keyed_server):
    text = STORY * 4 + "Who baked the bread?"
    salted = {"extra_body": {"cache_salt": "bakers-guild"}}
    first = cached(keyed_server, "sk-bob", text, **salted)
    shared = cached(keyed_server, "sk-carol", text, **salted)
    unsalted = cached(keyed_server, "sk-carol", text)
    assert first == 0 and shared > 0 and unsalted == 0
