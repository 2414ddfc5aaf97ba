"""Bearer keys on the real app, in-process: open by default; /v1 and /admin guarded once keys are set."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from orchestrator.api.app import build_app
from orchestrator.config import load_config
from orchestrator.engine.catalogue import discover
from tests.fakes.workers import FakeWorkers


def statuses(default_engine, flags: list[str], calls: list[tuple[str, str, str | None]]) -> list[int]:
    """Each call is (method, path, key); a key with a space is sent as the whole Authorization header."""
    config = load_config(["--engines-dir", str(default_engine.parent), "--models", default_engine.name, *flags])
    catalogue = discover(config.engines_dir, config.models)

    async def go() -> list[int]:
        workers = FakeWorkers()
        workers.hold_loads(default_engine.name)  # the model is still loading throughout: not ready
        async with TestClient(TestServer(build_app(config, catalogue, workers))) as client:
            results = []
            for method, path, key in calls:
                header = key if key and " " in key else f"Bearer {key}"
                headers = {"Authorization": header} if key else {}
                response = await client.request(method, path, headers=headers)
                if response.status == 401:
                    assert (await response.json())["error"]["type"] == "authentication_error"
                results.append(response.status)
            return results

    return asyncio.run(go())


def test_without_keys_everything_is_open(default_engine):
    assert statuses(default_engine, [], [("GET", "/v1/models", None), ("GET", "/admin/models", None)]) == [200, 200]


def test_api_keys_guard_v1_but_not_probes(default_engine):
    flags = ["--auth.api-keys", "k1,k2"]
    calls = [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models", "wrong"),
        ("GET", "/v1/models", "k2"),
        ("GET", "/health", None),
        ("GET", "/ready", None),
        ("GET", "/admin/models", "k1"),  # API keys are not admin keys, and no admin key is set
    ]
    assert statuses(default_engine, flags, calls) == [401, 401, 200, 200, 503, 401]


def test_the_admin_key_opens_admin_and_v1(default_engine):
    flags = ["--auth.api-keys", "k1", "--auth.admin-key", "root"]
    calls = [("GET", "/admin/models", "k1"), ("GET", "/admin/models", "root"), ("GET", "/v1/models", "root")]
    assert statuses(default_engine, flags, calls) == [401, 200, 200]


@pytest.mark.parametrize(
    "header, status", [("Basic azE=", 401), ("Bearer  ", 401), ("bearer k1", 200), ("Bearer k1 ", 200)]
)
def test_header_forms(default_engine, header, status):
    assert statuses(default_engine, ["--auth.api-keys", "k1"], [("GET", "/v1/models", header)]) == [status]


def test_with_keys_metrics_need_a_scrape_key_or_an_admin_key(default_engine, tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.prometheus]\nkey = "scrape-me"\nmetrics = true\nmodels = []\n'
                    '[keys.alice]\nkey = "sk-alice"\n[keys.ops]\nkey = "sk-ops"\nadmin = true\n')
    calls = [("GET", "/metrics", None), ("GET", "/metrics", "wrong"), ("GET", "/metrics", "sk-alice"),
             ("GET", "/metrics", "scrape-me"), ("GET", "/metrics", "sk-ops"), ("GET", "/v1/models", "scrape-me"),
             ("GET", "/admin/models", "scrape-me"), ("GET", "/health", None)]
    assert statuses(default_engine, ["--auth.keys-file", str(keys)], calls) == [401, 401, 401, 200, 200, 200, 401, 200]


def test_without_keys_metrics_stay_open(default_engine):
    assert statuses(default_engine, [], [("GET", "/metrics", None)]) == [200]
