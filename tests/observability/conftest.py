"""Fixtures for the observability tests: Debian's Prometheus and promtool, and a Prometheus server that
scrapes a live Inferno on loopback."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, ServerProcess, wait_for

DEPLOY = ROOT / "deploy"
SCRAPE_INTERVAL_S = 1


@pytest.fixture(scope="session")
def prometheus_tools() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`. `make test` installs them (Debian's `prometheus` package) before the
    suite runs; without them the observability tests fail, saying so, rather than skip."""
    tools = shutil.which("prometheus"), shutil.which("promtool")
    if not all(tools):
        pytest.fail("prometheus and promtool are not installed: `make test-deps` installs Debian's prometheus "
                    "package (or: apt-get install prometheus)")
    return tools


@pytest.fixture(scope="session")
def promtool(prometheus_tools) -> str:
    return prometheus_tools[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log_path: Path

    def query(self, promql: str) -> list[dict]:
        """An instant query's result vector: [{"metric": {labels}, "value": [time, "value"]}, ...]."""
        status, body = http_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
        answer = json.loads(body)
        assert answer["status"] == "success", f"{promql}: {answer.get('error')} (HTTP {status})"
        return answer["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The value of a query that selects one series; None while it selects none."""
        result = self.query(promql)
        assert len(result) <= 1, f"{promql} selects {len(result)} series: {result}"
        return float(result[0]["value"][1]) if result else None

    def wait_for_value(self, promql: str, expected: float, timeout: float = 60) -> None:
        """Poll until the query's value is `expected`, as Prometheus scrapes; fail with the last value seen."""
        seen: list[float | None] = []

        def settled() -> bool:
            seen.append(self.value(promql))
            return seen[-1] == expected

        try:
            wait_for(settled, timeout=timeout, interval=0.25, what=promql)
        except AssertionError:
            pytest.fail(f"{promql} = {seen[-1]} after {timeout} s, expected {expected}")


def _scrape_config(target: str) -> dict:
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": [
            {"job_name": "inferno", "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}
        ],
    }


@pytest.fixture(scope="module")
def prometheus(prometheus_tools, server: ServerProcess, tmp_path_factory) -> Iterator[Prometheus]:
    """A real Prometheus on a free loopback port, scraping the module's Inferno every second, with its
    storage in a temporary folder; stopped at the end of the module."""
    target = urllib.parse.urlparse(server.base_url).netloc
    with running_prometheus(prometheus_tools, _scrape_config(target), tmp_path_factory.mktemp("prometheus")) as prom:
        wait_for(lambda: _target_up(prom), timeout=60, interval=0.25, what="Prometheus to scrape Inferno")
        yield prom


@contextlib.contextmanager
def running_prometheus(prometheus_tools, scrape_config: dict, folder: Path) -> Iterator[Prometheus]:
    """A real Prometheus on a free loopback port with this configuration, its storage in `folder`."""
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config))
    port = free_port()
    log_path = folder / "prometheus.log"
    command = [
        prometheus_tools[0],
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_for(
            lambda: process.poll() is not None or http_get(f"{prom.url}/-/ready")[0] == 200,
            timeout=60, interval=0.1, what="Prometheus to be ready",
        )
        assert process.poll() is None, f"Prometheus exited:\n{log_path.read_text()}"
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _target_up(prom: Prometheus) -> bool:
    return prom.value('up{job="inferno"}') == 1.0
