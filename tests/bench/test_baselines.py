"""`python -m bench.baselines` as developers run it: `inferno bench` against a real Inferno server with the
backend driven in-process and the bare SSE server after it, each bare server alone as the target, both together,
and the raw server's answers to what it cannot serve."""

from __future__ import annotations

import socket

import pytest

from bench.baselines import start_bare_sse
from tests.bench.test_e2e import bench
from tests.conftest import DEFAULT_MODEL

pytestmark = pytest.mark.e2e
BASELINES = ("-m", "bench.baselines")


def test_tiny_run_against_inferno_with_the_in_process_and_bare_sse_baselines(tmp_path, default_engine):
    report, result = bench(
        tmp_path, "--engines-dir", str(default_engine.parent), "--model", DEFAULT_MODEL, "--concurrency", "2",
        "--requests", "4", "--isl", "32", "--osl", "8", "--warmup", "1", "--in-process", "--baseline-sse",
        "--engine-threads", "1", "--exclude-threads", "Thread-*",
        command=BASELINES, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["errors"] == 0 and report["prompts"]["isl_exact"]
    assert report["command"][:3] == ["python", "-m", "bench.baselines"]
    http, in_process, bare = report["rows"]
    assert (http["series"], in_process["series"], bare["series"]) == ("http", "in-process", "bare-sse")
    for row in (http, in_process, bare):
        assert (row["ok"], row["errors"]) == (4, 0)
        assert row["output_tokens"] == 4 * 8  # ignore_eos: exactly --osl each, served, in-process and bare
        assert row["ttft_s"]["n"] == 4
    for row in (http, in_process):
        assert row["prompt_tokens"]["p50"] == row["prompt_tokens"]["p99"] == 32  # counted by the server too
    roles = {p["role"]: p for p in http["server_cpu"]["processes"]}
    assert {"http", f"worker:{DEFAULT_MODEL}"} <= set(roles)
    assert roles[f"worker:{DEFAULT_MODEL}"]["cpu_s"] > 0 and http["server_cpu"]["us_per_token"] > 0
    assert "us_per_token_excluding" in http["server_cpu"]
    assert [ratio["of"] for ratio in report["ratios"]] == ["in-process", "bare-sse"]
    assert "http / in-process at concurrency 2: throughput" in result.stdout
    assert all(ratio["output_tok_s"] > 0 for ratio in report["ratios"])
    assert report["settings"]["baselines"] == {"in-process": {}, "bare-sse": {"step_ms": 0.0, "burst": 1}}


@pytest.mark.parametrize(("flag", "kind"), [("--baseline-sse", "bare-sse"), ("--baseline-raw", "raw-sse")])
def test_a_bare_server_alone_is_the_target(tmp_path, flag, kind):
    report, result = bench(
        tmp_path, flag, "--endpoint", "chat", "--concurrency", "2", "--requests", "4", "--osl", "6",
        "--sse-burst", "4", command=BASELINES,
    )
    assert result.returncode == 0, result.stderr
    assert report["target"]["kind"] == kind and report["target"]["burst"] == 4
    (row,) = report["rows"]
    assert (row["series"], row["ok"], row["errors"], row["chunks"]) == (kind, 4, 0, 4 * 6)
    assert row["output_tokens"] == 4 * 6 and row["output_tokens_from"] == "usage"
    assert row["client"]["events"] == 4 * (1 + 6 + 1)  # the role chunk, one chunk per token, the usage chunk
    assert row["server_cpu"]["processes"][0]["role"] == kind
    assert report["ratios"] == [] and report["settings"]["baselines"] == {}


def test_both_bare_servers_the_aiohttp_one_as_the_target_and_the_raw_one_as_its_baseline(tmp_path):
    report, result = bench(
        tmp_path, "--baseline-sse", "--baseline-raw", "--concurrency", "4", "--requests", "8", "--osl", "16",
        "--floor-rounds", "0", command=BASELINES,
    )
    assert result.returncode == 0, result.stderr
    assert [(row["series"], row["ok"], row["chunks"]) for row in report["rows"]] == [
        ("bare-sse", 8, 8 * 16), ("raw-sse", 8, 8 * 16)]
    assert [ratio["of"] for ratio in report["ratios"]] == ["raw-sse"]
    assert "bare-sse / raw-sse at concurrency 4: throughput" in result.stdout  # the target's series, then the other
    assert report["settings"]["baselines"] == {"raw-sse": {"step_ms": 0.0, "burst": 1}}


def _exchange(address: tuple[str, int], data: bytes, end: bytes) -> bytes:
    """Send `data` on a new connection and read until what came ends with `end` or the server closes the
    connection; a server that does neither within 10 s fails the test (socket.timeout)."""
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(data)
        received = b""
        while not received.endswith(end) and (chunk := conn.recv(65536)):
            received += chunk
    return received


ERROR_END = b"}}"  # the end of a JSON error body, {"error": {...}}


def test_the_raw_server_answers_what_it_cannot_serve_with_a_json_error(tmp_path):
    server = start_bare_sse(step_ms=0, burst=1, log_path=tmp_path / "raw.log", kind="raw-sse")
    try:
        host, port = server.api.removeprefix("http://").removesuffix("/v1").split(":")
        address = (host, int(port))
        post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
        not_streamed = b'{"model": "bare-sse", "max_tokens": 3, "messages": []}'
        answer = _exchange(address, post % (len(not_streamed), not_streamed), ERROR_END)
        assert answer.startswith(b"HTTP/1.1 400 ") and b'"param":"stream"' in answer
        assert _exchange(address, b"GET /nowhere HTTP/1.1\r\n\r\n", ERROR_END).startswith(b"HTTP/1.1 404 ")
        refused = _exchange(address, b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                            ERROR_END)
        assert refused.startswith(b"HTTP/1.1 411 ") and b"Connection: close" in refused
        assert _exchange(address, b"NONSENSE\r\n\r\n", ERROR_END).startswith(b"HTTP/1.1 400 ")
        # Two requests in one send (the second a stream of 3 tokens) are both answered, in order.
        streamed = b'{"model": "bare-sse", "stream": true, "max_tokens": 3, "prompt": "hi"}'
        both = _exchange(address, b"GET /v1/models HTTP/1.1\r\n\r\n" + post.replace(b"chat/", b"") % (
            len(streamed), streamed), b"0\r\n\r\n")
        assert both.startswith(b"HTTP/1.1 200 OK\r\nContent-Type: application/json") and b'"bare-sse"' in both
        stream = both[both.index(b"text/event-stream") :]
        assert stream.count(b'"text":" tok"') == 3 and stream.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    finally:
        server.stop()
