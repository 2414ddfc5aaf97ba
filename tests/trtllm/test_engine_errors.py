"""What a client sees when a TensorRT-LLM engine fails a request, refuses to load, or is missing, and that the
engine's worker exits when the server stops. These need engines made to fail, so they run on the test double
of TensorRT-LLM's bindings only (the engine folders say how: a smaller input limit in config.json than the
manifest claims, a fault plan in rank0.engine, an older TensorRT-LLM in the manifest)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import psutil
import pytest

from tests.conftest import ServerProcess, admin_models, start_server, wait_for
from tests.trtllm.conftest import double_env, make_trtllm_engine, real_tensorrt_llm

pytestmark = pytest.mark.e2e

STORY = "Once upon a time, in a land far away, there lived a dragon who"


@pytest.fixture(scope="module")
def server(default_engine, tmp_path_factory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("trtllm-errors")
    engines = root / "engines"
    make_trtllm_engine(default_engine, engines, "short-input", build={"max_input_len": 64})
    make_trtllm_engine(default_engine, engines, "faulty", plan={"fail_after_tokens": 5})
    make_trtllm_engine(default_engine, engines, "old-build", tools={"tensorrt_llm": "1.2.0", "tensorrt": "10.13.2.6"})
    make_trtllm_engine(default_engine, engines, "two-gpus", tp=2)
    process = start_server(engines, root / "server.log", env=double_env())
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def model_states(server) -> dict:
    try:
        with urllib.request.urlopen(f"{server.base_url}/ready", timeout=10) as response:
            return json.loads(response.read())["models"]
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())["models"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_error_response_before_any_token_is_an_http_error(client, stream):
    """The manifest admits 100 prompt tokens; the engine, built for 64, answers with an error response."""
    with pytest.raises(openai.InternalServerError) as caught:
        reply = client.completions.create(model="short-input", prompt=[300] * 100, max_tokens=4, stream=stream)
        list(reply) if stream else None
    assert caught.value.status_code == 500
    assert caught.value.body["code"] == "engine_error"
    assert "exceeds maximum input length (64)" in caught.value.body["message"]


def test_an_error_response_after_tokens_is_an_sse_error_event(client):
    stream = client.completions.create(model="faulty", prompt=STORY, max_tokens=50, stream=True)
    text = ""
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            text += chunk.choices[0].text
    assert text  # tokens came first: the error can only be an event in the stream
    assert "forwardAsync" in str(caught.value)


def test_the_engine_serves_on_after_error_responses(client):
    for model, prompt in (("short-input", [300] * 10), ("faulty", STORY)):
        reply = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0)
        assert reply.choices[0].finish_reason == "length"


def test_an_engine_built_by_another_tensorrt_llm_is_refused_with_the_rebuild_command(server, client):
    assert model_states(server)["old-build"] == "failed"
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="old-build", prompt=STORY, max_tokens=3)
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "model_unavailable"
    message = caught.value.body["message"]
    assert "built with TensorRT-LLM 1.2.0, but this server runs TensorRT-LLM 1.2.1" in message
    assert "make build-engine MODEL=old-build" in message


def test_a_two_gpu_engine_is_served_from_one_worker_in_orchestrator_mode(server, client):
    reply = client.completions.create(model="two-gpus", prompt=STORY, max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    pid = admin_models(server.base_url)["two-gpus"]["pid"]
    assert pid in [p.pid for p in psutil.Process(server.process.pid).children()]  # the server's own child
    started = [line for line in server.log().splitlines() if "worker[two-gpus]" in line and "executor started" in line]
    assert started and "orchestrator mode" in started[-1] and "world size 2" in started[-1]


def test_stopping_the_server_shuts_the_executor_down_and_ends_the_worker(default_engine, tmp_path):
    make_trtllm_engine(default_engine, tmp_path / "engines")
    server = start_server(tmp_path / "engines", tmp_path / "server.log", env=double_env())
    worker = psutil.Process(admin_models(server.base_url)["tiny-trt"]["pid"])
    assert server.stop() == 0
    wait_for(lambda: not worker.is_running(), what="the worker process to exit")
    assert "TensorRT-LLM executor shut down" in server.log()


def test_without_tensorrt_llm_the_model_fails_to_load_and_says_what_to_install(default_engine, tmp_path):
    if real_tensorrt_llm():
        pytest.skip("TensorRT-LLM is installed here")
    make_trtllm_engine(default_engine, tmp_path / "engines")
    server = start_server(tmp_path / "engines", tmp_path / "server.log")  # no test double on the path
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model="tiny-trt", prompt=STORY, max_tokens=3)
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "backend_unavailable"
        message = caught.value.body["message"]
        assert "TensorRT-LLM 1.2.1" in message and "nvcr.io/nvidia/tensorrt-llm/release:1.2.1" in message
    finally:
        server.stop()
