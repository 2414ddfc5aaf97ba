"""TensorRT-LLM's Executor constructor holds the GIL for the whole engine load (reference §8): the worker's
event loop is frozen until it returns. Nothing depends on the worker answering meanwhile: the server sends the
load and waits for one answer (bounded by the load timeout), shows the model as loading, keeps answering
/health itself, and a request that arrives during the load waits for it and is served. On the test double,
whose constructor holds the GIL for as long as the engine's fault plan says."""

from __future__ import annotations

import threading
import time
import urllib.request

import openai
import pytest

from tests.conftest import admin_models, start_server
from tests.trtllm.conftest import double_env, make_trtllm_engine

pytestmark = pytest.mark.e2e

LOAD_S = 4.0


def test_a_load_that_holds_the_workers_gil_is_waited_for_and_the_server_stays_responsive(default_engine, tmp_path):
    engines = tmp_path / "engines"
    make_trtllm_engine(default_engine, engines, "slow-load", plan={"load_s": LOAD_S})
    # Nothing loads at start: the first request loads the model while the test watches.
    server = start_server(engines, tmp_path / "server.log", "--scheduling.preload", "pinned", env=double_env())
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
        answer: dict = {}

        def ask():
            answer["reply"] = client.completions.create(model="slow-load", prompt="Once upon a time", max_tokens=4)

        states, health_s = set(), []
        asker = threading.Thread(target=ask)
        asker.start()
        while asker.is_alive():
            states.add(admin_models(server.base_url)["slow-load"]["state"])
            started = time.perf_counter()
            with urllib.request.urlopen(f"{server.base_url}/health", timeout=10) as response:
                assert response.status == 200
            health_s.append(time.perf_counter() - started)
            time.sleep(0.1)
        asker.join()
        log = server.log()
    finally:
        server.stop()
    assert "loading" in states  # the server knew the model was loading all along
    assert answer["reply"].choices[0].finish_reason == "length" and answer["reply"].usage.completion_tokens == 4
    assert len(health_s) >= LOAD_S / 0.5  # polled throughout the load
    assert max(health_s) < 1.0, health_s  # the HTTP process never waited on the frozen worker
    assert "timed out" not in log and "exited unexpectedly" not in log
