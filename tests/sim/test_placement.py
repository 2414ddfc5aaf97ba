"""Four sim models on one simulated 80 GB H100, where two fit at a time: models load on demand, the least
recently used idle one is evicted to make room, and every eviction is counted."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from orchestrator.backends.sim.spec import load_sim_spec
from orchestrator.engine.gpus import GPUS
from orchestrator.engine.manifest import load_manifest
from tests.conftest import copy_engine, metric, start_server
from tests.sim.conftest import build_fast

pytestmark = pytest.mark.e2e
MODELS = ("alpha", "beta", "gamma", "delta")
KV_BYTES = 20 * 2**30  # 9.1 GB of FP8 weights + 21.5 GB of KV cache + 2.7 GB overhead = 33.2 GB each


@pytest.fixture(scope="module")
def built(sim_engine_dir, tmp_path_factory):
    return build_fast(
        tmp_path_factory.mktemp("built"), "placed", "--checkpoint", str(sim_engine_dir), "--sim-speedup", "50",
        "--sim-param", "load_s=0.05", "--sim-param", f"kv_cache_bytes={KV_BYTES}",
    )


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    for name in MODELS:
        copy_engine(built, engines, name)
    proc = start_server(engines, tmp_path_factory.mktemp("server") / "server.log", "--scheduling.preload", "pinned")
    yield proc
    proc.stop()


def described(server) -> dict:
    return json.loads(urllib.request.urlopen(f"{server.base_url}/admin/models", timeout=30).read())


def loaded(server) -> list[str]:
    return sorted(m["name"] for m in described(server)["models"] if m["state"] == "ready")


def test_only_two_of_four_fit_and_the_least_recently_used_makes_room(server):
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    state = described(server)
    ledger = state["ledger"]
    assert ledger["device"] == "sim:h100-sxm" and ledger["capacity_bytes"] == GPUS["h100-sxm"].memory_bytes
    assert loaded(server) == []

    for name in ("alpha", "beta"):
        client.completions.create(model=name, prompt="Hello", max_tokens=4)
    assert loaded(server) == ["alpha", "beta"]
    models = {m["name"]: m for m in described(server)["models"]}
    footprint = models["alpha"]["memory_bytes"]
    assert 33e9 < footprint < 33.5e9 and models["beta"]["memory_bytes"] == footprint  # the simulated bytes

    alpha_pid = models["alpha"]["pid"]
    client.completions.create(model="gamma", prompt="Hello", max_tokens=4)  # evicts alpha, the older
    assert loaded(server) == ["beta", "gamma"]
    models = {m["name"]: m for m in described(server)["models"]}
    assert models["gamma"]["pid"] == alpha_pid  # alpha's worker, released, was the spare gamma loaded into
    client.completions.create(model="beta", prompt="Hello", max_tokens=4)  # beta is now the most recent
    client.completions.create(model="delta", prompt="Hello", max_tokens=4)  # evicts gamma
    assert loaded(server) == ["beta", "delta"]

    state = described(server)
    evictions = {m["name"]: m["evictions"] for m in state["models"]}
    assert evictions == {"alpha": 1, "beta": 0, "gamma": 1, "delta": 0}
    assert state["ledger"]["used_bytes"] == 2 * footprint <= state["ledger"]["capacity_bytes"] - state["ledger"]["reserve_bytes"]
    assert state["devices"][0]["used_bytes"] == 2 * footprint
    for name in ("alpha", "gamma"):
        assert metric(server.base_url, "inferno_model_unloads_total", model=name, reason="evicted") == 1


def test_the_footprint_is_weights_kv_and_overhead(server, built):
    ready = [m for m in described(server)["models"] if m["state"] == "ready"]
    manifest, spec = load_manifest(built), load_sim_spec(built)
    expected = manifest.weights_bytes + KV_BYTES + spec.runtime_overhead_bytes
    assert ready and all(m["memory_bytes"] == expected for m in ready)
