"""A worker that dies fails its own requests at once, with a clear error, and the model comes back."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, metric, wait_for

pytestmark = pytest.mark.e2e

STORY = [{"role": "user", "content": "Write a very long story about a dragon."}]


def worker_pids(server) -> list[int]:
    """The model's worker, as the server reports it."""
    with urllib.request.urlopen(f"{server.base_url}/admin/models", timeout=5) as response:
        models = json.loads(response.read())["models"]
    return [m["pid"] for m in models if m["name"] == DEFAULT_MODEL and m["pid"] is not None]


def kill_worker_mid_stream(server, client) -> tuple[int, openai.APIError, float]:
    """Loads the model (whatever ran before), starts a long stream, SIGKILLs the worker at its third chunk:
    (the killed pid, the error the stream ended with, seconds from the kill to that error)."""
    client.completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=1)
    [pid] = worker_pids(server)
    stream = client.chat.completions.create(model=DEFAULT_MODEL, messages=STORY, max_tokens=1000, stream=True,
                                            extra_body={"ignore_eos": True})  # long on every backend
    received = 0
    with pytest.raises(openai.APIError) as caught:
        for _ in stream:
            received += 1
            if received == 3:
                killed_at = time.monotonic()
                os.kill(pid, signal.SIGKILL)
    return pid, caught, time.monotonic() - killed_at


def test_killed_worker_fails_its_stream_with_an_error_event_then_reloads(server):
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    ask = dict(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hi"}], temperature=0, max_tokens=24)
    before = client.chat.completions.create(**ask).choices[0].message.content
    pid, caught, failed_after = kill_worker_mid_stream(server, client)
    assert failed_after < 1.0, f"the stream failed {failed_after:.2f} s after the worker died"
    assert "exited" in str(caught.value) and "SIGKILL" in str(caught.value)
    wait_for(lambda: metric(server.base_url, "inferno_requests_running", model=DEFAULT_MODEL) == 0)

    assert client.chat.completions.create(**ask).choices[0].message.content == before  # the same model came back
    [new_pid] = worker_pids(server)
    assert new_pid != pid


def model_states(server) -> dict:
    try:
        with urllib.request.urlopen(f"{server.base_url}/ready", timeout=5) as response:
            return json.loads(response.read())["models"]
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())["models"]


def test_an_idle_worker_that_dies_is_noticed_and_the_next_request_reloads_it(server):
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    [pid] = worker_pids(server)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: model_states(server)[DEFAULT_MODEL] == "unloaded", timeout=5, what="the crash to be noticed")
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=STORY, max_tokens=4,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert model_states(server)[DEFAULT_MODEL] == "ready"


def test_a_request_right_after_a_crash_is_served_or_told_when_to_retry(server):
    """Sent at once after SIGKILL, before the server may have noticed: it either waits for the reload and is
    answered, or (its submit met the dying worker) gets 503 with Retry-After. Never a 503 without one."""
    [pid] = worker_pids(server)
    body = json.dumps({"model": DEFAULT_MODEL, "messages": STORY, "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{server.api}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    os.kill(pid, signal.SIGKILL)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, retry_after = response.status, None
    except urllib.error.HTTPError as exc:
        status, retry_after = exc.code, exc.headers.get("Retry-After")
    assert status == 200 or (status == 503 and int(retry_after) >= 1), (status, retry_after)
    wait_for(lambda: model_states(server)[DEFAULT_MODEL] in ("unloaded", "ready"), timeout=10, what="recovery")
