"""The conformance suite: one set of API tests, run on every backend that serves a real model here, each through
one real server that the whole session shares (tests/conftest.py's `hf_server` and `llamacpp_server`).

Tests state properties that hold on any machine (stream equals non-stream, a seed reproduces itself, finish
reasons agree with usage, output equals a reference computed in the same run), never a model's words: the
quantised matmuls of llama.cpp take other paths on other CPUs, and a greedy answer changes with them."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from orchestrator.engine.manifest import Limits, load_manifest
from tests.conftest import ServerProcess

BACKENDS = ("hf", "llamacpp")
ENGINE_FIXTURES = {"hf": "default_engine", "llamacpp": "gguf_engine"}


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def served_engine(request, backend: str) -> Path:
    return request.getfixturevalue(ENGINE_FIXTURES[backend])


@pytest.fixture(scope="session")
def server(request, backend: str) -> ServerProcess:
    """The session's server of this backend's engine, served under the default model's name."""
    return request.getfixturevalue(f"{backend}_server")


@pytest.fixture(scope="session")
def limits(served_engine: Path) -> Limits:
    return load_manifest(served_engine).limits


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
