"""Worker crashes (tests/e2e/test_worker_crash.py) on a llamacpp engine: a killed worker fails its own requests at
once and the model loads again on the next request. The suite's first test checks the reload with the hf
model's "Paris" answer; here the same test checks it with an answer this model gives."""

import openai

from tests.conftest import DEFAULT_MODEL, metric, wait_for
from tests.e2e.test_worker_crash import *  # noqa: F403 (its tests; `server` comes from conftest here)
from tests.e2e.test_worker_crash import kill_worker_mid_stream, worker_pids

del globals()["test_killed_worker_fails_its_stream_with_an_error_event_then_reloads"]


def test_killed_worker_fails_its_stream_with_an_error_then_reloads(server):
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    pid, caught, _ = kill_worker_mid_stream(server, client)
    assert "exited" in str(caught.value) and "SIGKILL" in str(caught.value)
    wait_for(lambda: metric(server.base_url, "inferno_requests_running", model=DEFAULT_MODEL) == 0)
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hi"}],
                                           temperature=0)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content
    [new_pid] = worker_pids(server)
    assert new_pid != pid
