"""Fairness between API keys on the real server (the embedded default, llama.cpp), driven by `inferno bench
--scenario two-keys`: one key floods at concurrency 32 into a small queue, another sends one request at a time.
The flood overfills the model's queue (it gets 429s), and the other key never does. Timings are the benchmark's
business (docs/benchmarking.md), not this test's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.access.keys import hash_key
from tests.conftest import DEFAULT_MODEL, ROOT, start_server

pytestmark = pytest.mark.e2e

VICTIM_REQUESTS = 4


def test_a_keys_flood_never_turns_another_keys_request_into_a_429(gguf_engine, tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[keys.flood]\nkey = "{hash_key("sk-flood")}"\n[keys.victim]\nkey = "{hash_key("sk-victim")}"\n')
    server = start_server(gguf_engine.parent, tmp_path / "server.log", "--models", DEFAULT_MODEL,
                          "--scheduling.max-queue", "4", env={"INFERNO_AUTH__KEYS_FILE": str(keys)})
    try:
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator", "bench", "--scenario", "two-keys", "--url", server.api,
             "--api-key", "sk-flood", "--victim-key", "sk-victim", "--model", DEFAULT_MODEL, "--concurrency", "32",
             "--osl", "32", "--victim-osl", "4", "--requests", str(VICTIM_REQUESTS), "--warmup", "1",
             "--out", str(tmp_path)],
            capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    [path] = tmp_path.glob("two-keys-*.json")
    report = json.loads(path.read_text())
    flood, under = report["flood"], report["victim"]["under_flood"]
    assert flood["rejected_429"] > 0  # the flood did fill the queue: without fairness the victim was refused too
    assert report["victim_429"] == 0, under["error_messages"]
    assert under["ok"] == report["victim"]["alone"]["ok"] == VICTIM_REQUESTS
    assert under["ttft_s"]["n"] == VICTIM_REQUESTS
