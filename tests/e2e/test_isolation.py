"""Models side by side: a crash stays with its own model; queues are bounded; interactive requests overtake
batch ones; idle models go away after their keep-alive. Real SmolLM2 engines under three names."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import openai
import pytest

from tests.conftest import copy_engine, let_go, start_server, wait_for

pytestmark = pytest.mark.e2e

STORY = [{"role": "user", "content": "Write a very long story about a dragon."}]
SETTINGS = """
[models.alpha]
max_concurrency = 1
max_queue = 2

[models.gamma]
keep_alive_s = 1
"""


@pytest.fixture(scope="module")
def server(default_engine, tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    for name in ("alpha", "beta", "gamma"):
        copy_engine(default_engine, engines, name)
    settings = engines.parent / "models.toml"
    settings.write_text(SETTINGS)
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_server(
        engines, log_path, "--worker.kv-cache-bytes", str(64 * 2**20), "--model-settings", str(settings)
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def models(server) -> dict[str, dict]:
    with urllib.request.urlopen(f"{server.base_url}/admin/models", timeout=10) as response:
        return {m["name"]: m for m in json.loads(response.read())["models"]}


def in_thread(target) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            result["value"] = target()
        except Exception as exc:
            result["error"] = exc
        result["done_at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_models_that_fit_are_loaded_at_start(server):
    states = models(server)
    assert states["alpha"]["state"] == states["beta"]["state"] == "ready"
    assert states["gamma"]["loads"] == 1  # loaded at start (it may have gone idle and away since)


def test_a_killed_worker_fails_only_its_own_requests_and_comes_back(server, client):
    beta_pid = models(server)["beta"]["pid"]
    alpha_pid = models(server)["alpha"]["pid"]
    beta_stream = client.chat.completions.create(model="beta", messages=STORY, max_tokens=48, stream=True, temperature=0)
    alpha_stream = client.chat.completions.create(model="alpha", messages=STORY, max_tokens=4000, stream=True)
    beta_chunks = [next(iter(beta_stream))]
    received = 0
    with pytest.raises(openai.APIError) as caught:
        for _ in alpha_stream:
            received += 1
            if received == 2:
                killed_at = time.monotonic()
                os.kill(alpha_pid, signal.SIGKILL)
    assert time.monotonic() - killed_at < 1.0
    assert "worker for model 'alpha' exited" in str(caught.value)

    beta_chunks += list(beta_stream)  # the other model never noticed
    assert beta_chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in beta_chunks)
    assert models(server)["beta"]["pid"] == beta_pid
    assert models(server)["alpha"]["crashes"] == 1

    reply = client.chat.completions.create(model="alpha", messages=STORY, max_tokens=3)
    assert reply.choices[0].finish_reason == "length"
    assert models(server)["alpha"]["pid"] not in (None, alpha_pid)


def test_a_full_queue_is_a_429_with_retry_after(server, client):
    busy = client.chat.completions.create(model="alpha", messages=STORY, max_tokens=4000, stream=True)
    next(iter(busy))  # alpha's only permit is taken
    queued = [in_thread(lambda: client.chat.completions.create(model="alpha", messages=STORY, max_tokens=2))
              for _ in range(2)]
    wait_for(lambda: models(server)["alpha"]["queued"] == 2, what="two queued requests")
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="alpha", messages=STORY, max_tokens=2)
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    assert "queued" in caught.value.message
    busy.close()
    for thread, result in queued:
        thread.join(timeout=60)
        assert result["value"].choices[0].finish_reason == "length"


def test_interactive_requests_overtake_batch_requests(server, client):
    busy = client.chat.completions.create(model="alpha", messages=STORY, max_tokens=4000, stream=True)
    next(iter(busy))

    def call(tier):
        return lambda: client.chat.completions.create(model="alpha", messages=STORY, max_tokens=8, service_tier=tier)

    batch = in_thread(call("flex"))
    wait_for(lambda: models(server)["alpha"]["queued"] == 1, what="the batch request to queue")
    interactive = in_thread(call("priority"))
    wait_for(lambda: models(server)["alpha"]["queued"] == 2, what="the interactive request to queue")
    busy.close()
    for thread, _ in (batch, interactive):
        thread.join(timeout=60)
    assert "value" in batch[1] and "value" in interactive[1]
    assert interactive[1]["done_at"] < batch[1]["done_at"]  # one permit: the later, interactive one ran first


def test_an_idle_model_is_unloaded_after_its_keep_alive(server, client):
    client.chat.completions.create(model="gamma", messages=STORY, max_tokens=2)
    pid = models(server)["gamma"]["pid"]
    assert pid is not None
    wait_for(lambda: models(server)["gamma"]["state"] == "unloaded", timeout=15, what="gamma's idle unload")
    assert let_go(server.base_url, pid)
    assert models(server)["alpha"]["state"] == "ready"  # keep-alive is per model
