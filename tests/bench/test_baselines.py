"""`python -m bench.baselines` as developers run it: `inferno bench` against a real Inferno server with the
backend driven in-process and the bare SSE server after it, and the bare server alone as the target."""

from __future__ import annotations

import pytest

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
    assert all(ratio["output_tok_s"] > 0 for ratio in report["ratios"])
    assert report["settings"]["baselines"] == {"in-process": {}, "bare-sse": {"step_ms": 0.0, "burst": 1}}


def test_the_bare_server_alone_is_the_target(tmp_path):
    report, result = bench(
        tmp_path, "--baseline-sse", "--endpoint", "chat", "--concurrency", "2", "--requests", "4", "--osl", "6",
        "--sse-burst", "4", command=BASELINES,
    )
    assert result.returncode == 0, result.stderr
    assert report["target"]["kind"] == "bare-sse" and report["target"]["burst"] == 4
    (row,) = report["rows"]
    assert (row["series"], row["ok"], row["errors"], row["chunks"]) == ("bare-sse", 4, 0, 4 * 6)
    assert row["server_cpu"]["processes"][0]["role"] == "bare-sse"
    assert report["ratios"] == [] and report["settings"]["baselines"] == {}
