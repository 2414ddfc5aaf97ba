"""Kept weights on a real server with real llama.cpp engines on the CPU, each unloaded as soon as it is idle: an
unloaded model's GGUF file is held by the server (pinned wherever this machine lets a process lock that much memory),
shown in /admin/models, counted in the ledger and by inferno_kept_weights_bytes; loading the model again stops
keeping it."""

from __future__ import annotations

import json
import resource
import urllib.request

import openai
import pytest

from tests.conftest import admin_models, copy_engine, metric, start_server, wait_for

pytestmark = pytest.mark.e2e

KV_BYTES = 64 * 2**20
CAP_IPC_LOCK = 14


def may_lock(nbytes: int) -> bool:
    """Whether a process started from this one may mlock `nbytes` (CAP_IPC_LOCK, or RLIMIT_MEMLOCK)."""
    with open("/proc/self/status") as status:
        effective = int(next(line for line in status if line.startswith("CapEff:")).split()[1], 16)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return bool(effective >> CAP_IPC_LOCK & 1) or soft == resource.RLIM_INFINITY or soft >= nbytes


@pytest.fixture(scope="module")
def server(gguf_engine, tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    for name in ("alpha", "beta"):
        copy_engine(gguf_engine, engines, name)
    proc = start_server(
        engines, tmp_path_factory.mktemp("server") / "server.log", "--worker.kv-cache-bytes", str(KV_BYTES),
        "--scheduling.keep-alive-s", "0", "--scheduling.preload", "pinned",
    )
    yield proc
    proc.stop()


def kept_model(server, name: str, pinned: bool | None = None) -> dict:
    """The model's kept weights, once kept (and, with `pinned`, once their read-in has pinned them or not)."""
    def kept():
        weights = admin_models(server.base_url)[name]["kept_weights"]
        return weights if weights and (pinned is None or weights["pinned"] is pinned) else None
    return wait_for(kept, what=f"{name}'s weights kept (pinned: {pinned})")


def ledger(server) -> dict:
    with urllib.request.urlopen(f"{server.base_url}/admin/models", timeout=30) as response:
        return json.loads(response.read())["ledger"]


def test_an_unloaded_models_gguf_file_is_kept_until_it_loads_again(server, gguf_engine):
    size = (gguf_engine / "model.gguf").stat().st_size
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    client.completions.create(model="alpha", prompt="Hello", max_tokens=2)  # unloaded once idle
    assert kept_model(server, "alpha", pinned=may_lock(size))["bytes"] == size
    assert ledger(server)["kept_weights_bytes"] == size
    assert metric(server.base_url, "inferno_kept_weights_bytes", model="alpha") == size
    assert metric(server.base_url, "inferno_kept_weights_bytes", model="beta") == 0

    client.completions.create(model="beta", prompt="Hello", max_tokens=2)
    kept_model(server, "beta")
    assert ledger(server)["kept_weights_bytes"] == 2 * size

    stream = client.completions.create(model="alpha", prompt="Hello", max_tokens=64, stream=True)
    next(iter(stream))  # alpha is loaded again and busy: its load used its kept file
    models = admin_models(server.base_url)
    assert models["alpha"]["kept_weights"] is None and models["beta"]["kept_weights"]["bytes"] == size
    assert metric(server.base_url, "inferno_kept_weights_bytes", model="alpha") == 0
    stream.close()
