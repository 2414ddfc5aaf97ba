"""Shared fixtures: the real SmolLM2 engine and real server processes."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator import launch
from orchestrator.engine.manifest import Limits, load_manifest
from orchestrator.launch import ServerProcess, copy_engine

__all__ = ["ServerProcess", "copy_engine", "start_server"]

ROOT = Path(__file__).resolve().parent.parent
ENGINES = Path(os.environ.get("INFERNO_TEST_ENGINES_DIR", ROOT / "engines"))
DEFAULT_MODEL = "smollm2-135m"  # the embedded default's name, as clients ask for it
# The suite's main engine: the same model on the hf backend (PyTorch), served under DEFAULT_MODEL. The embedded
# default itself (the llamacpp engine `make serve` builds) runs the conformance suite (tests/conformance/) too.
HF_RECIPE = "smollm2-135m-hf"
GGUF_RECIPE = DEFAULT_MODEL  # the embedded default is the GGUF engine


_STARTED: list[ServerProcess] = []
DOUBLES = ROOT / "tests" / "doubles"
TRTLLM_ABSENT = ("TensorRT-LLM 1.2.1 is not installed here (it needs NVIDIA GPUs and NVIDIA's package index); "
                 "the same suites run on its test double")


def real_tensorrt_llm() -> bool:
    """Whether the real package is importable, whatever the in-process tests put on sys.path or imported."""
    paths = [p for p in sys.path if Path(p or ".").resolve() != DOUBLES]
    return importlib.machinery.PathFinder.find_spec("tensorrt_llm", paths) is not None


def pytest_collection_modifyitems(config, items):
    """Tests on the real TensorRT-LLM (marker `trtllm`) are deselected where it is not installed, and the run's
    summary says why in one line, instead of a skip per test."""
    real = [item for item in items if item.get_closest_marker("trtllm")]
    if real and not real_tensorrt_llm():
        items[:] = [item for item in items if not item.get_closest_marker("trtllm")]
        config.hook.pytest_deselected(items=real)
        config.stash[_TRTLLM_DESELECTED] = len(real)


def pytest_terminal_summary(terminalreporter, config):
    count = config.stash.get(_TRTLLM_DESELECTED, 0)
    if count:
        terminalreporter.write_line(f"{count} tests on the real TensorRT-LLM deselected: {TRTLLM_ABSENT}")


_TRTLLM_DESELECTED = pytest.StashKey[int]()


def start_server(*args, **kwargs) -> ServerProcess:
    """`orchestrator.launch.start_server`, remembered so that a server a failed test left running is stopped when
    the session ends instead of outliving it."""
    server = launch.start_server(*args, **kwargs)
    _STARTED.append(server)
    return server


@pytest.fixture(scope="session", autouse=True)
def _stop_leftover_servers() -> Iterator[None]:
    yield
    for server in _STARTED:
        server.stop(timeout=10)


@pytest.fixture(scope="session", autouse=True)
def _data_dir(tmp_path_factory) -> Iterator[None]:
    """What the servers of a test run keep (the response store) goes to a temporary folder, not the checkout:
    in-process apps and server processes alike read INFERNO_DATA_DIR."""
    before = os.environ.get("INFERNO_DATA_DIR")
    os.environ["INFERNO_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    yield
    if before is None:
        del os.environ["INFERNO_DATA_DIR"]
    else:
        os.environ["INFERNO_DATA_DIR"] = before


def build_engine(recipe: str) -> Path:
    """A catalogue recipe's engine under ENGINES, built once (a cache hit when it is built already)."""
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build", recipe, "--engines-dir", str(ENGINES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return ENGINES / recipe


@pytest.fixture(scope="session")
def default_engine(tmp_path_factory) -> Path:
    """The suite's engine (the hf one), alone in an engines folder under the default model's name."""
    return copy_engine(build_engine(HF_RECIPE), tmp_path_factory.mktemp("engines"), DEFAULT_MODEL)


@pytest.fixture(scope="session")
def limits(default_engine: Path) -> Limits:
    """The limits of the engine `server` serves (tests/conformance gives each backend's engine's)."""
    return load_manifest(default_engine).limits


@pytest.fixture(scope="session")
def gguf_engine() -> Path:
    """The embedded default as `make serve` builds it: the SmolLM2 GGUF engine on llama.cpp."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")
    return build_engine(GGUF_RECIPE)


def serve_alone(engine: Path, tmp_path_factory, what: str) -> Iterator[ServerProcess]:
    """A real server of one engine, copied alone into an engines folder under the default model's name."""
    engines = tmp_path_factory.mktemp(f"{what}-engines")
    copy_engine(engine, engines, DEFAULT_MODEL)
    proc = start_server(engines, tmp_path_factory.mktemp(f"{what}-server") / "server.log", "--models", DEFAULT_MODEL)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def hf_server(default_engine: Path, tmp_path_factory) -> Iterator[ServerProcess]:
    """The session's real server of the hf engine: the conformance suite's hf backend, and `server` elsewhere."""
    yield from serve_alone(default_engine, tmp_path_factory, "hf")


@pytest.fixture(scope="session")
def llamacpp_server(gguf_engine: Path, tmp_path_factory) -> Iterator[ServerProcess]:
    """The session's real server of the embedded default (llamacpp)."""
    yield from serve_alone(gguf_engine, tmp_path_factory, "llamacpp")


@pytest.fixture(scope="session")
def server(hf_server: ServerProcess) -> ServerProcess:
    """The real server most suites talk to, shared by the session. A suite that needs a fresh one (counters
    from zero, settings of its own) starts its own."""
    return hf_server


def scrape(base_url: str, scrape_key: str | None = None) -> dict[tuple[str, tuple], float]:
    """Every sample of the server's /metrics (read with `scrape_key` where keys guard it), keyed by (name, sorted
    label pairs)."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {scrape_key}"} if scrape_key else {}
    request = urllib.request.Request(f"{base_url}/metrics", headers=headers)
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def let_go(base_url: str, pid: int) -> bool:
    """After an unload: the model's worker exited (its memory with it), or it is the spare now, kept because it gave
    its engine's memory back (the worker checks its resident memory before it says so)."""
    if not psutil.pid_exists(pid):
        return True
    with urllib.request.urlopen(f"{base_url}/admin/models", timeout=30) as response:
        return json.loads(response.read())["spare_worker_pid"] == pid


def metric(base_url: str, name: str, scrape_key: str | None = None, **labels) -> float:
    """One sample's value (0 when the series does not exist yet)."""
    return scrape(base_url, scrape_key).get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(condition, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll `condition` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def admin_models(base_url: str) -> dict[str, dict]:
    """The server's own view of each model (state, worker pid, counters), from /admin/models."""
    with urllib.request.urlopen(f"{base_url}/admin/models", timeout=30) as response:
        return {model["name"]: model for model in json.loads(response.read())["models"]}
