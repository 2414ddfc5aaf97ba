"""`inferno bench` as users run it: a subprocess, against a server that streams a known number of chunks."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.baselines import start_bare_sse
from orchestrator.bench.targets import Target
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def bench(out: Path, *args: str, command: tuple[str, ...] = ("-m", "orchestrator", "bench"),
          timeout: float = 300) -> tuple[dict, subprocess.CompletedProcess]:
    result = subprocess.run(
        [sys.executable, *command, "--out", str(out), "--no-plot", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False,
    )
    files = sorted(out.glob("bench-*.json"))
    assert files, result.stdout + result.stderr
    return json.loads(files[-1].read_text()), result


@pytest.fixture
def bare_server(tmp_path) -> Iterator[Target]:
    """The bare SSE server (bench/sse_server.py): every stream gets 2 tokens a tick, one chunk each."""
    server = start_bare_sse(step_ms=0, burst=2, log_path=tmp_path / "bare-sse.log")
    yield server
    server.stop()


@pytest.mark.parametrize(("endpoint", "events_per_request"), [("completions", 16 + 1), ("chat", 1 + 16 + 1)])
def test_exact_chunk_counts_from_a_server_at_a_url(tmp_path, bare_server, endpoint, events_per_request):
    report, result = bench(
        tmp_path, "--url", bare_server.api, "--server-pid", str(bare_server.pid), "--endpoint", endpoint,
        "--concurrency", "1,4", "--rate", "200", "--requests", "8", "--osl", "16", "--slo", "ttft=30",
        "--floor-rounds", "200",  # a second
    )
    assert result.returncode == 0, result.stderr
    assert report["errors"] == 0 and report["target"]["kind"] == "url"
    assert report["target"]["models"] == ["bare-sse"]  # the first the server lists
    assert [row["load"] for row in report["rows"]] == [{"concurrency": 1}, {"concurrency": 4}, {"rate": 200.0}]
    floor = report["floor"]
    assert floor["sockets"] == 4  # one step's writes at the highest concurrency level
    assert floor["writes"] == 4 * 200 and floor["bytes_read"] == floor["writes"] * floor["chunk_bytes"]
    assert floor["us_per_write"] > 0 and f"floor: {floor['us_per_write']} us" in result.stdout
    for row in report["rows"]:
        assert (row["series"], row["requests"], row["ok"], row["errors"]) == ("http", 8, 8, 0)
        assert row["chunks"] == 8 * 16  # one text chunk per token
        assert row["output_tokens"] == 8 * 16 and row["output_tokens_from"] == "usage"
        assert row["client"]["events"] == 8 * events_per_request  # + the role chunk on chat, + usage
        assert row["client"]["cpu_us_per_chunk"] > 0
        assert row["goodput"]["fraction"] == 1.0
        assert row["server_cpu"]["processes"][0]["role"] == "server"  # --server-pid: measured, named generically
        server = row["server_cpu"]  # set against the kernel's floor measured before the run
        assert server["floor_us_per_token"] == floor["us_per_write"]
        assert server["floor_ratio"] == round(server["us_per_token"] / floor["us_per_write"], 2)
    assert report["rows"][2]["client"]["send_lag_s"]["n"] == 8
    assert "http" in result.stdout and "wrote" in result.stdout


def test_settings_that_cannot_be_honoured_are_refused_before_anything_starts(tmp_path):
    completed = subprocess.run(  # nothing listens on port 9: a refusal after connecting would say so
        [sys.executable, "-m", "orchestrator", "bench", "--url", "http://127.0.0.1:9", "--osl", "0",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )
    assert completed.returncode == 2 and "at least 1 token (got 0)" in completed.stderr
    assert not list(tmp_path.glob("*.json"))
