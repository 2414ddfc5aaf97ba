"""A real Prometheus scrapes a live Inferno serving SmolLM2; what PromQL answers must match what the clients
saw. The same live /metrics is linted by promtool, and every query the dashboard and the alerts run is checked
against it."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess, serve_alone
from tests.observability.conftest import DEPLOY, Prometheus, http_get
from tests.observability.promql import (
    exposed_families,
    grafana_to_promql,
    metric_names,
    sampled_names,
    selectable_names,
)

pytestmark = pytest.mark.e2e

MODEL = f'model="{DEFAULT_MODEL}"'
MAX_TOKENS = 6
PROMPTS = ["Name a colour.", "What is 2 + 2?", "Say hello.", "Name a fruit."]
HISTOGRAMS_PER_REQUEST = (
    "inferno_e2e_request_latency_seconds",
    "inferno_request_queue_time_seconds",
    "inferno_request_prompt_tokens",
    "inferno_request_generation_tokens",
)


@dataclass
class Traffic:
    """What the clients sent and saw."""

    finish_reasons: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    with_tokens: int = 0  # requests that generated a token: each gives one time to first token
    multi_token: int = 0  # requests that generated more than one token: each gives one inter-token latency
    chat: int = 0
    text: int = 0

    @property
    def requests(self) -> int:
        return self.chat + self.text

    def saw(self, finish_reason: str, usage) -> None:
        self.finish_reasons[finish_reason] += 1
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.with_tokens += usage.completion_tokens > 0
        self.multi_token += usage.completion_tokens > 1


@pytest.fixture(scope="module")
def server(default_engine, tmp_path_factory):
    """A server of its own: what Prometheus counts must be this module's traffic and nothing before it."""
    yield from serve_alone(default_engine, tmp_path_factory, "prometheus")


@pytest.fixture(scope="module")
def traffic(server: ServerProcess, prometheus: Prometheus) -> Traffic:
    """Chat completions (JSON) and streamed text completions, one invalid request and one unknown model."""
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    seen = Traffic()
    for prompt in PROMPTS:
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0
        )
        seen.saw(reply.choices[0].finish_reason, reply.usage)
        seen.chat += 1
    for prompt in PROMPTS[:2]:
        finish, usage = None, None
        for chunk in client.completions.create(
            model=DEFAULT_MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
        ):
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
            usage = chunk.usage or usage
        seen.saw(finish, usage)
        seen.text += 1
    invalid = urllib.request.Request(
        f"{server.api}/chat/completions", data=b'{"model": 3}', headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(invalid, timeout=30)
    assert refused.value.code == 400
    assert http_get(f"{server.api}/models/no-such-model")[0] == 404
    return seen


def test_request_counts_by_finish_reason_match_what_clients_saw(prometheus, traffic):
    prometheus.wait_for_value(f'sum(inferno_requests_total{{{MODEL},status_class="2xx"}})', traffic.requests)
    for reason, count in traffic.finish_reasons.items():
        prometheus.wait_for_value(
            f'inferno_requests_total{{{MODEL},status_class="2xx",finish_reason="{reason}"}}', count
        )
    assert prometheus.value(f'sum(inferno_requests_total{{{MODEL},status_class!="2xx"}})') is None


def test_token_counters_match_the_usage_clients_got(prometheus, traffic):
    prometheus.wait_for_value(f"inferno_prompt_tokens_total{{{MODEL}}}", traffic.prompt_tokens)
    prometheus.wait_for_value(f"inferno_generation_tokens_total{{{MODEL}}}", traffic.completion_tokens)
    prometheus.wait_for_value(f"inferno_request_prompt_tokens_sum{{{MODEL}}}", traffic.prompt_tokens)
    prometheus.wait_for_value(f"inferno_request_generation_tokens_sum{{{MODEL}}}", traffic.completion_tokens)


@pytest.mark.parametrize("histogram", HISTOGRAMS_PER_REQUEST)
def test_each_request_is_one_observation_in_every_phase_histogram(prometheus, traffic, histogram):
    prometheus.wait_for_value(f"{histogram}_count{{{MODEL}}}", traffic.requests)
    prometheus.wait_for_value(f'{histogram}_bucket{{{MODEL},le="+Inf"}}', traffic.requests)


def test_time_to_first_token_counts_requests_that_generated_a_token(prometheus, traffic):
    prometheus.wait_for_value(f"inferno_time_to_first_token_seconds_count{{{MODEL}}}", traffic.with_tokens)


def test_inter_token_latency_counts_requests_with_a_second_token(prometheus, traffic):
    prometheus.wait_for_value(f"inferno_inter_token_latency_seconds_count{{{MODEL}}}", traffic.multi_token)


def test_generation_lengths_fall_in_the_buckets_they_belong_to(prometheus, traffic):
    prometheus.wait_for_value(f"inferno_request_generation_tokens_count{{{MODEL}}}", traffic.requests)
    # Every request generated at most MAX_TOKENS (6) tokens, and the buckets run 1, 4, 16: none lies above 16.
    assert prometheus.value(f'inferno_request_generation_tokens_bucket{{{MODEL},le="16.0"}}') == traffic.requests
    assert prometheus.value(f'inferno_request_generation_tokens_bucket{{{MODEL},le="1.0"}}') < traffic.requests


def test_http_durations_by_route_method_and_status(prometheus, traffic):
    durations = "inferno_http_request_duration_seconds_count"
    chat, text = '"/v1/chat/completions"', '"/v1/completions"'
    prometheus.wait_for_value(f'{durations}{{route={chat},method="POST",status="200"}}', traffic.chat)
    prometheus.wait_for_value(f'{durations}{{route={text},method="POST",status="200"}}', traffic.text)
    prometheus.wait_for_value(f'{durations}{{route={chat},method="POST",status="400"}}', 1)
    prometheus.wait_for_value(f'{durations}{{route="/v1/models/{{model}}",method="GET",status="404"}}', 1)


def test_scheduler_events_and_model_state(prometheus, traffic):
    prometheus.wait_for_value(f"inferno_model_load_seconds_count{{{MODEL}}}", 1)
    prometheus.wait_for_value(f'inferno_model_state{{{MODEL},state="ready"}}', 1)
    assert prometheus.value(f"sum(inferno_model_state{{{MODEL}}})") == 1
    assert prometheus.value(f"inferno_worker_restarts_total{{{MODEL}}}") == 0
    assert prometheus.value(f"sum(inferno_model_unloads_total{{{MODEL}}})") == 0


def test_engine_gauges_describe_the_kv_cache(prometheus, traffic):
    total = prometheus.value(f'inferno_kv_cache_blocks{{{MODEL},kind="total"}}')
    assert total and total > 0
    free = prometheus.value(f'inferno_kv_cache_blocks{{{MODEL},kind="free"}}')
    used = prometheus.value(f'inferno_kv_cache_blocks{{{MODEL},kind="used"}}')
    assert free + used == total
    assert 0 <= prometheus.value(f"inferno_kv_cache_usage_ratio{{{MODEL}}}") <= 1


# -- the live exposition ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exposition(server, traffic, prometheus) -> str:
    """/metrics after the traffic (every labelled series exists by then)."""
    prometheus.wait_for_value(f'sum(inferno_requests_total{{{MODEL}}})', traffic.requests)
    status, body = http_get(f"{server.base_url}/metrics")
    assert status == 200
    return body.decode()


def test_promtool_finds_nothing_to_report_in_live_metrics(promtool, exposition):
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_every_inferno_metric_is_documented(exposition):
    documented = (DEPLOY.parent / "docs" / "metrics.md").read_text()
    missing = [name for name in exposed_families(exposition) if f"`{name}`" not in documented]
    assert not missing, f"exposed but not in docs/metrics.md: {missing}"


def test_every_name_follows_the_conventions(exposition):
    for name, kind in exposed_families(exposition).items():
        assert name.startswith("inferno_"), name
        assert name.endswith("_total") == (kind == "counter"), f"{name} is a {kind}"


def _dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "inferno.json").read_text())
    return [
        (f"{panel['title']} / {target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def _alert_queries() -> list[tuple[str, str]]:
    import yaml

    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def _check_names(where: str, expr: str, exposition: str) -> set[str]:
    names = metric_names(grafana_to_promql(expr))
    assert names, f"{where}: no metric found in {expr}"
    unknown = names - selectable_names(exposed_families(exposition)) - {"up"}  # `up`: Prometheus's own, per target
    assert not unknown, f"{where}: {sorted(unknown)} are not exposed by the server"
    return names


@pytest.mark.parametrize(("where", "expr"), _dashboard_queries())
def test_dashboard_queries_read_exposed_metrics_and_show_data(prometheus, exposition, where, expr):
    names = _check_names(where, expr, exposition)
    result = prometheus.query(grafana_to_promql(expr))  # Prometheus parses it, or the query fails
    if names <= sampled_names(exposition):  # device memory and engine-only series may have no samples here
        assert result, f"{where}: no data for {expr}, though every metric it reads has samples"


@pytest.mark.parametrize(("alert", "expr"), _alert_queries())
def test_alert_expressions_read_exposed_metrics(prometheus, exposition, alert, expr):
    _check_names(alert, expr, exposition)
    prometheus.query(expr)  # Prometheus parses it, or the query fails


def test_the_dashboard_model_variable_reads_an_exposed_metric(exposition):
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "inferno.json").read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "model")
    metric = variable["query"]["query"].removeprefix("label_values(").split(",")[0]
    assert metric in sampled_names(exposition)
