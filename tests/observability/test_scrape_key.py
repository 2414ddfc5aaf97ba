"""A real Prometheus scrapes a real Inferno whose keys guard /metrics, with the scrape job deploy/ ships: its
bearer credentials read from a file (compose's secret) holding the scrape key. Another key, or none, and the
target is down."""

from __future__ import annotations

import urllib.parse

import pytest
import yaml

from orchestrator.access.keys import hash_key
from tests.conftest import start_server, wait_for
from tests.observability.conftest import DEPLOY, SCRAPE_INTERVAL_S, running_prometheus

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def keyed_server(default_engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("scraped")
    keys = folder / "keys.toml"
    keys.write_text(f'[keys.prometheus]\nkey = "{hash_key("sk-scrape")}"\nmetrics = true\nmodels = []\n'
                    f'[keys.alice]\nkey = "{hash_key("sk-alice")}"\n')
    server = start_server(default_engine.parent, folder / "server.log", "--models", default_engine.name,
                          env={"INFERNO_AUTH__KEYS_FILE": str(keys)})
    yield server
    server.stop()


def test_the_shipped_scrape_job_reads_metrics_with_the_scrape_key_and_nothing_else_does(
        prometheus_tools, keyed_server, tmp_path):
    [shipped] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    key_file = tmp_path / "scrape-key"
    key_file.write_text("sk-scrape\n")  # as a secret file usually ends
    target = urllib.parse.urlparse(keyed_server.base_url).netloc
    with_key = {**shipped, "static_configs": [{"targets": [target]}],
                "authorization": {**shipped["authorization"], "credentials_file": str(key_file)},
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"}
    alice = {**with_key, "job_name": "alice", "authorization": {"type": "Bearer", "credentials": "sk-alice"}}
    keyless = {key: value for key, value in with_key.items() if key != "authorization"} | {"job_name": "keyless"}
    config = {"scrape_configs": [with_key, alice, keyless]}
    with running_prometheus(prometheus_tools, config, tmp_path) as prom:
        wait_for(lambda: all(prom.value(f'up{{job="{job}"}}') is not None for job in ("inferno", "alice", "keyless")),
                 timeout=60, interval=0.25, what="Prometheus to scrape every job once")
        ups = {job: prom.value(f'up{{job="{job}"}}') for job in ("inferno", "alice", "keyless")}
        series = prom.value('count({__name__=~"inferno_.+", job="inferno"})')
        others = prom.value('count({__name__=~"inferno_.+", job!="inferno"})')
    assert ups == {"inferno": 1.0, "alice": 0.0, "keyless": 0.0}
    assert series and series > 0 and others is None
