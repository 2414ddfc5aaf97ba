"""`inferno bench` as users run it: a subprocess, against the bare SSE server and a real Inferno server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_MODEL, ROOT

pytestmark = pytest.mark.e2e


def bench(out: Path, *args: str, timeout: float = 300) -> tuple[dict, subprocess.CompletedProcess]:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "--out", str(out), "--no-plot", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False,
    )
    files = sorted(out.glob("bench-*.json"))
    assert files, result.stdout + result.stderr
    return json.loads(files[-1].read_text()), result


@pytest.mark.parametrize(("endpoint", "events_per_request"), [("completions", 16 + 1), ("chat", 1 + 16 + 1)])
def test_bare_sse_server_exact_chunk_counts(tmp_path, endpoint, events_per_request):
    report, result = bench(
        tmp_path, "--baseline-sse", "--endpoint", endpoint, "--concurrency", "1,4", "--rate", "200",
        "--requests", "8", "--osl", "16", "--sse-burst", "2", "--slo", "ttft=30",
    )
    assert result.returncode == 0, result.stderr
    assert report["errors"] == 0 and report["target"]["kind"] == "bare-sse"
    assert [row["load"] for row in report["rows"]] == [{"concurrency": 1}, {"concurrency": 4}, {"rate": 200.0}]
    for row in report["rows"]:
        assert (row["series"], row["requests"], row["ok"], row["errors"]) == ("bare-sse", 8, 8, 0)
        assert row["chunks"] == 8 * 16  # one text chunk per token
        assert row["output_tokens"] == 8 * 16 and row["output_tokens_from"] == "usage"
        assert row["client"]["events"] == 8 * events_per_request  # + the role chunk on chat, + usage
        assert row["client"]["cpu_us_per_chunk"] > 0
        assert row["goodput"]["fraction"] == 1.0
        assert row["server_cpu"]["processes"][0]["role"] == "bare-sse"
    assert report["rows"][2]["client"]["send_lag_s"]["n"] == 8
    assert "bare-sse" in result.stdout and "wrote" in result.stdout


def test_settings_that_cannot_be_honoured_are_refused_before_anything_starts(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "--baseline-sse", "--osl", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )
    assert completed.returncode == 2 and "at least 1 token (got 0)" in completed.stderr
    assert not list(tmp_path.glob("*.json"))


def test_tiny_run_against_inferno_with_the_in_process_baseline(tmp_path, default_engine):
    report, result = bench(
        tmp_path, "--engines-dir", str(default_engine.parent), "--model", DEFAULT_MODEL, "--concurrency", "2",
        "--requests", "4", "--isl", "32", "--osl", "8", "--warmup", "1", "--in-process",
        "--engine-threads", "1", "--exclude-threads", "Thread-*",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["errors"] == 0 and report["prompts"]["isl_exact"]
    http, in_process = report["rows"]
    assert (http["series"], in_process["series"]) == ("http", "in-process")
    for row in (http, in_process):
        assert (row["ok"], row["errors"]) == (4, 0)
        assert row["prompt_tokens"]["p50"] == row["prompt_tokens"]["p99"] == 32  # counted by the server too
        assert row["output_tokens"] == 4 * 8  # ignore_eos: exactly --osl each, served and in-process
        assert row["ttft_s"]["n"] == 4
    roles = {p["role"]: p for p in http["server_cpu"]["processes"]}
    assert {"http", f"worker:{DEFAULT_MODEL}"} <= set(roles)
    assert roles[f"worker:{DEFAULT_MODEL}"]["cpu_s"] > 0 and http["server_cpu"]["us_per_token"] > 0
    assert "us_per_token_excluding" in http["server_cpu"]
    (ratio,) = report["ratios"]
    assert ratio["of"] == "in-process" and ratio["output_tok_s"] > 0
