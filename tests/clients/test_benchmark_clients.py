"""Real benchmark clients against the real server on the real SmolLM2 engine, run as their users run them
for a bounded, fixed-length profile and judged by their own JSON exports: NVIDIA's `aiperf` (chat, streaming)
and `guidellm` (text completions, streaming with continuous usage).

Each client lives in its own virtual environment under .venv-clients/ (about a gigabyte each), which
`make test-clients` installs; these tests are left out of `make test` (marker `clients`). Run them with
`make test-clients`, or `pytest -m clients` once the environments exist.

`vllm bench serve` is not run: it ships only inside the whole vllm package (a CUDA build of torch, flashinfer
and other GPU kernels), and its request bodies are checked in tests/conformance/test_client_fields.py instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_MODEL, ROOT

pytestmark = pytest.mark.clients

REQUESTS, CONCURRENCY = 8, 4
INPUT_TOKENS, OUTPUT_TOKENS = 64, 32
CLIENT_TIMEOUT_S = 1800  # a bound on a client that hangs, far above a run's length even on a busy machine
# Variables that must not reach a client: aiperf's offline mode takes a local tokenizer folder for a hub
# name, and this project's own path settings are no business of the client's interpreter.
WITHHELD_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONPATH", "VIRTUAL_ENV")


def client_program(name: str) -> Path:
    """The client's command in its own environment. Skips where it is not installed, unless the caller
    (make test-clients) said where it must be: then its absence fails."""
    required = os.environ.get("INFERNO_CLIENT_VENVS")
    program = Path(required or ROOT / ".venv-clients") / name / "bin" / name
    if not program.exists():
        message = f"{name} is not installed at {program}; `make test-clients` installs it"
        if required:
            pytest.fail(message)
        pytest.skip(message)
    return program


def run_client(command: list[str], workdir: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in WITHHELD_ENV}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    result = subprocess.run([str(part) for part in command], cwd=workdir, env=env, capture_output=True, text=True,
                            timeout=CLIENT_TIMEOUT_S, check=False)
    assert result.returncode == 0, f"{command[0]} exited {result.returncode}:\n{(result.stdout + result.stderr)[-4000:]}"


def test_aiperf_fixed_length_chat_profile_has_no_errors_and_every_answer_has_its_length(
        server, default_engine, tmp_path):
    artifacts = tmp_path / "artifacts"
    run_client([
        client_program("aiperf"), "profile", "--model", DEFAULT_MODEL, "--url", server.base_url,
        "--endpoint-type", "chat", "--streaming", "--request-count", REQUESTS, "--concurrency", CONCURRENCY,
        "--synthetic-input-tokens-mean", INPUT_TOKENS, "--output-tokens-mean", OUTPUT_TOKENS,
        "--extra-inputs", "ignore_eos:true", "--tokenizer", default_engine, "--use-server-token-count",
        "--request-timeout-seconds", CLIENT_TIMEOUT_S, "--no-gpu-telemetry", "--ui-type", "none",
        "--artifact-dir", artifacts,
    ], tmp_path)
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert (summary["is_complete"], summary["was_cancelled"], summary["error_summary"]) == (True, False, [])
    assert summary["request_count"]["avg"] == REQUESTS
    assert summary["request_error_rate"]["avg"] == 0
    lengths = summary["output_sequence_length"]
    assert (lengths["count"], lengths["min"], lengths["max"]) == (REQUESTS, OUTPUT_TOKENS, OUTPUT_TOKENS)
    assert summary["osl_mismatch_count"]["avg"] == 0  # aiperf's own check: each answer as long as it asked


def test_guidellm_fixed_length_completions_run_has_no_errors_and_every_answer_has_its_length(
        server, default_engine, tmp_path):
    report = tmp_path / "benchmarks.json"
    run_client([
        client_program("guidellm"), "run",
        "--backend", f"kind=openai_http,target={server.base_url},model={DEFAULT_MODEL},request_format=/v1/completions",
        "--profile", f"kind=concurrent,streams={CONCURRENCY}",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--tokenizer", f"kind=hf_auto,model={default_engine}",
        "--output", f"kind=json,path={report}", "--disable-console-interactive",
    ], tmp_path)
    [benchmark] = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    lengths = benchmark["metrics"]["output_token_count"]["successful"]
    assert (lengths["count"], lengths["min"], lengths["max"]) == (REQUESTS, OUTPUT_TOKENS, OUTPUT_TOKENS)
