"""The conformance suite: one set of API tests, run on every backend that serves a real model here, each through
one real server that the whole session shares (tests/conftest.py's `hf_server` and `llamacpp_server`).

Tests state properties that hold on any machine (stream equals non-stream, a seed reproduces itself, finish
reasons agree with usage, output equals a reference computed in the same run), never a model's words: the
quantised matmuls of llama.cpp take other paths on other CPUs, and a greedy answer changes with them."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from orchestrator.backends import Features, features_of
from orchestrator.engine.manifest import Limits, load_manifest
from tests.conftest import DEFAULT_MODEL, ServerProcess, start_server
from tests.sim.conftest import SIM_MODEL
from tests.sim.conftest import build as sim_build
from tests.trtllm.conftest import double_env, make_trtllm_engine

BACKENDS = ("hf", "llamacpp", "trtllm", "sim")
ENGINE_FIXTURES = {"hf": "default_engine", "llamacpp": "gguf_engine", "trtllm": "trtllm_double_engine",
                   "sim": "sim_conformance_engine"}


@pytest.fixture(scope="session")
def sim_conformance_engine(tmp_path_factory) -> Path:
    """A simulated Llama 3.1 8B H100 engine, 50 times faster than the GPU, with SmolLM2's tokenizer as its
    stand-in, built as `make build-engine MODEL=llama3.1-8b-sim` builds it."""
    engines = tmp_path_factory.mktemp("sim-engines")
    code, output = sim_build(SIM_MODEL, "--engines-dir", str(engines), "--name", DEFAULT_MODEL, "--sim-speedup", "50",
                             "--sim-param", "load_s=0.05")
    assert code == 0, output
    return engines / DEFAULT_MODEL


@pytest.fixture(scope="session")
def sim_server(sim_conformance_engine: Path, tmp_path_factory):
    proc = start_server(sim_conformance_engine.parent, tmp_path_factory.mktemp("sim-server") / "server.log",
                        "--models", DEFAULT_MODEL)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def trtllm_double_engine(default_engine: Path, tmp_path_factory) -> Path:
    """A TensorRT-LLM engine folder of SmolLM2's shape, for the test double of TensorRT-LLM's bindings (which
    repeats the prompt as its answer: tests/doubles/tensorrt_llm/bindings/executor.py)."""
    return make_trtllm_engine(default_engine, tmp_path_factory.mktemp("trtllm-engines"), DEFAULT_MODEL)


@pytest.fixture(scope="session")
def trtllm_server(trtllm_double_engine: Path, tmp_path_factory):
    """The session's server of the trtllm engine, its worker on the test double of TensorRT-LLM."""
    proc = start_server(trtllm_double_engine.parent, tmp_path_factory.mktemp("trtllm-server") / "server.log",
                        "--models", DEFAULT_MODEL, env=double_env())
    yield proc
    proc.stop()


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


@pytest.fixture(scope="session")
def features(served_engine: Path) -> Features:
    """What this backend honours beyond what every backend must; the rest it refuses with a 400 naming the field."""
    return features_of(load_manifest(served_engine))


@pytest.fixture
def a_real_model(backend: str) -> None:
    """For tests of what a field does to a model's distribution: the TensorRT-LLM double has none (it repeats the
    prompt), nor has the simulator (its text is synthetic), so those run on the real models; tests/trtllm checks
    that the fields reach TensorRT-LLM as its API spells them, and the sim backend refuses the ones it cannot
    honour (test_client_fields.py, through the feature table)."""
    if backend in ("trtllm", "sim"):
        pytest.skip(f"the {backend} backend's text has no distribution for this field to change (a test double, a "
                    "simulator)")
