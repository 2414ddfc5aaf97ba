"""API keys on the real server, through the official `openai` client: the keys file given by environment
variable (never on the command line), a model the key may not use, requests per minute with Retry-After,
and exact per-key usage in /admin/usage, /metrics and the audit log after a known workload; also a slow
request head cut off by the header timeout."""

from __future__ import annotations

import json
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from orchestrator.access.keys import hash_key
from tests.conftest import DEFAULT_MODEL, metric, start_server, wait_for

pytestmark = pytest.mark.e2e

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def keyed_server(default_engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyed")
    keys = folder / "keys.toml"
    keys.write_text(f"""
        [keys.alice]
        key = "{hash_key('sk-alice')}"
        requests_per_minute = 1
        [keys.bob]
        key = "{hash_key('sk-bob')}"
        models = ["some-other-model"]
        [keys.ops]
        key = "{hash_key('sk-ops')}"
        admin = true
    """)
    audit = folder / "audit.jsonl"
    env = {"INFERNO_AUTH__KEYS_FILE": str(keys), "INFERNO_AUDIT__FILE": str(audit)}
    server = start_server(default_engine.parent, folder / "server.log", "--models", DEFAULT_MODEL,
                          "--http.header-timeout-s", "1", env=env)
    yield server, audit
    server.stop()


def client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=key, max_retries=0, timeout=120)


def ask(server, key: str):
    """A chat completion of 4 tokens; the reply, or the error the client raised."""
    try:
        return client(server, key).chat.completions.create(
            model=DEFAULT_MODEL, messages=CAPITAL, max_tokens=4, temperature=0
        )
    except openai.APIStatusError as exc:
        return exc


def test_per_key_limits_and_exact_usage_after_a_known_workload(keyed_server):
    server, audit = keyed_server
    with ThreadPoolExecutor(2) as pool:  # two at once: whichever comes second finds the minute's one request used
        answers = list(pool.map(lambda _: ask(server, "sk-alice"), range(2)))
    [reply] = [a for a in answers if not isinstance(a, Exception)]
    [limited] = [a for a in answers if isinstance(a, Exception)]
    hidden = ask(server, "sk-bob")
    with pytest.raises(openai.AuthenticationError):
        client(server, "sk-nobody").models.list()

    assert isinstance(limited, openai.RateLimitError) and 1 <= int(limited.response.headers["Retry-After"]) <= 60
    assert limited.body["code"] == "rate_limit_exceeded" and limited.request_id.startswith("req_")
    assert isinstance(hidden, openai.NotFoundError) and hidden.body["code"] == "model_not_found"
    assert "served here: none" in hidden.body["message"]
    prompt = reply.usage.prompt_tokens
    assert reply.usage.completion_tokens == 4

    request = urllib.request.Request(f"{server.base_url}/admin/usage", headers={"Authorization": "Bearer sk-ops"})
    with urllib.request.urlopen(request, timeout=30) as response:
        usage = json.loads(response.read())["keys"]
    assert usage["alice"]["total"]["requests"] == 2 and usage["alice"]["total"]["errors"] == 1
    assert usage["alice"]["total"]["prompt_tokens"] == prompt
    assert usage["alice"]["total"]["completion_tokens"] == 4
    assert usage["bob"]["total"] is None
    labels = {"key": "alice", "model": DEFAULT_MODEL}
    assert metric(server.base_url, "inferno_key_requests_total", status_class="2xx", scrape_key="sk-ops", **labels) == 1
    assert metric(server.base_url, "inferno_key_requests_total", status_class="4xx", scrape_key="sk-ops", **labels) == 1
    assert metric(server.base_url, "inferno_key_completion_tokens_total", scrape_key="sk-ops", **labels) == 4
    assert metric(server.base_url, "inferno_key_prompt_tokens_total", scrape_key="sk-ops", **labels) == prompt

    def audited_chats():  # the audit log's own thread writes the lines
        lines = [json.loads(line) for line in audit.read_text().splitlines()]
        return [(line["key"], line["status"], line.get("completion_tokens")) for line in lines
                if line["path"] == "/v1/chat/completions"]

    wait_for(lambda: len(audited_chats()) == 3, what="three chat requests in the audit log")
    assert audited_chats() == [("alice", 429, None), ("alice", 200, 4), ("bob", 404, None)]
    assert "capital" not in audit.read_text().lower() and "sk-" not in audit.read_text()


def test_a_request_head_that_never_ends_is_cut_off(keyed_server):
    server, _ = keyed_server
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert connection.recv(1024) == b""  # the server hung up (a 30 s socket timeout fails the test)
