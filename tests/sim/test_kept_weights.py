"""A swap on a simulated H100 where one of two sim models fits at a time: the evicted model's engine is kept in host
RAM (shown in /admin/models and by inferno_kept_weights_bytes), and swapping it back in loads it as a kept engine
does, its weights over the host-to-device link plus the runtime's start, not its cold `load_s`. Load times are
the server's reported ones (inferno_model_load_seconds), held against what the sim's spec says each load takes."""

from __future__ import annotations

import openai
import pytest

from orchestrator.backends.sim.spec import load_sim_spec
from orchestrator.engine.gpus import find_gpu
from orchestrator.engine.manifest import load_manifest
from tests.conftest import admin_models, copy_engine, metric, start_server, wait_for
from tests.sim.conftest import build_fast

pytestmark = pytest.mark.e2e
WEIGHTS = 2_000_000_000
KV_BYTES = 45 * 10**9  # 2 GB weights + 45 GB KV cache + 2.7 GB overhead each: one fits in 90% of 80 GiB, not two


@pytest.fixture(scope="module")
def built(sim_engine_dir, tmp_path_factory):
    return build_fast(
        tmp_path_factory.mktemp("built"), "kept", "--checkpoint", str(sim_engine_dir),
        "--sim-param", "load_s=1.5", "--sim-param", "init_s=0.1", "--sim-param", f"weights_bytes={WEIGHTS}",
        "--sim-param", f"kv_cache_bytes={KV_BYTES}",
    )


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    for name in ("alpha", "beta"):
        copy_engine(built, engines, name)
    proc = start_server(engines, tmp_path_factory.mktemp("server") / "server.log", "--scheduling.preload", "pinned")
    yield proc
    proc.stop()


def load_seconds(server, model: str) -> tuple[float, float]:
    """(loads, their seconds in all) as the server reports them."""
    return (metric(server.base_url, "inferno_model_load_seconds_count", model=model),
            metric(server.base_url, "inferno_model_load_seconds_sum", model=model))


def kept_bytes(server, model: str) -> float:
    return metric(server.base_url, "inferno_kept_weights_bytes", model=model)


def test_a_model_swapped_back_in_loads_from_its_kept_engine(server, built):
    spec, manifest = load_sim_spec(built), load_manifest(built)
    link = find_gpu(manifest.simulation.gpu).host_link_bytes_s
    cold, warm = (spec.load_seconds(WEIGHTS, link, 1, kept) for kept in (False, True))
    assert (cold, warm) == (1.5, pytest.approx(0.1 + WEIGHTS / spec.host_link_bytes_s))
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)

    client.completions.create(model="alpha", prompt="Hello", max_tokens=4)
    client.completions.create(model="beta", prompt="Hello", max_tokens=4)  # evicts alpha: its engine is kept
    models = wait_for(lambda: (m := admin_models(server.base_url))["alpha"]["kept_weights"] and m, what="alpha kept")
    assert models["alpha"]["state"] == "unloaded" and models["beta"]["kept_weights"] is None
    assert models["alpha"]["kept_weights"]["bytes"] == WEIGHTS and models["alpha"]["kept_weights"]["since"] > 0
    assert models["alpha"]["kept_weights"]["pinned"] is False  # a sim engine has no files to pin
    assert kept_bytes(server, "alpha") == WEIGHTS and kept_bytes(server, "beta") == 0
    (alpha_loads, alpha_cold), (_, beta_cold) = load_seconds(server, "alpha"), load_seconds(server, "beta")
    assert alpha_loads == 1 and alpha_cold >= cold and beta_cold >= cold

    client.completions.create(model="alpha", prompt="Hello", max_tokens=4)  # evicts beta; alpha from host RAM
    loads, total = load_seconds(server, "alpha")
    assert loads == 2 and warm <= total - alpha_cold < cold
    models = wait_for(lambda: (m := admin_models(server.base_url))["beta"]["kept_weights"] and m, what="beta kept")
    assert models["alpha"]["kept_weights"] is None and kept_bytes(server, "alpha") == 0  # its load used them
    assert metric(server.base_url, "inferno_model_unloads_total", model="beta", reason="evicted") == 1
