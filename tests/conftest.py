"""Shared fixtures: the real SmolLM2 engine and real server processes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINES = Path(os.environ.get("INFERNO_TEST_ENGINES_DIR", ROOT / "engines"))
DEFAULT_MODEL = "smollm2-135m"
READY_LINE = re.compile(r"Inferno ready: (http://[\d.]+:\d+)/v1")


@pytest.fixture(scope="session")
def default_engine() -> Path:
    """The embedded default engine, built once (a cache hit when `make test` already built it)."""
    folder = ENGINES / DEFAULT_MODEL
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build", DEFAULT_MODEL, "--engines-dir", str(ENGINES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return folder


@dataclass
class ServerProcess:
    process: subprocess.Popen
    base_url: str
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(engines_dir: Path, log_path: Path, *args: str, env: dict | None = None) -> ServerProcess:
    """Start `inferno serve` on a free loopback port and wait for its ready line."""
    command = [sys.executable, "-m", "orchestrator", "serve", "--port", "0", "--engines-dir", str(engines_dir), *args]
    log = log_path.open("w")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})}
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = READY_LINE.search(log_path.read_text(errors="replace"))
        if match:
            return ServerProcess(process, match.group(1), log_path)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"server did not become ready:\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def server(default_engine: Path, tmp_path_factory) -> Iterator[ServerProcess]:
    """One real server per test module, serving the real SmolLM2 engine."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_server(default_engine.parent, log_path, "--models", DEFAULT_MODEL)
    yield proc
    proc.stop()


def copy_engine(source: Path, engines_dir: Path, name: str) -> Path:
    """A second engine folder under another name, sharing the weights by hard link (no second build)."""
    target = engines_dir / name
    shutil.copytree(source, target, copy_function=os.link)
    manifest = target / "engine.json"
    manifest.unlink()  # hard-linked: replace, never edit in place
    text = (source / "engine.json").read_text().replace(f'"name": "{source.name}"', f'"name": "{name}"')
    manifest.write_text(text)
    return target


def scrape(base_url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the server's /metrics, keyed by (name, sorted label pairs)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{base_url}/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(base_url: str, name: str, **labels) -> float:
    """One sample's value (0 when the series does not exist yet)."""
    return scrape(base_url).get((name, tuple(sorted(labels.items()))), 0.0)


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
