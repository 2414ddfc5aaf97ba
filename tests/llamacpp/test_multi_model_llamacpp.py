"""Two llamacpp engines on a device whose ledger fits one: load on demand, least recently used eviction, and the
memory that comes back. The capacity is set from a first load's measured footprint."""

from __future__ import annotations

import json
import urllib.request

import openai
import psutil
import pytest

from tests.conftest import copy_engine, start_server

pytestmark = pytest.mark.e2e

KV_BYTES = 64 * 2**20
HI = [{"role": "user", "content": "Say hello."}]


def models(server) -> dict[str, dict]:
    with urllib.request.urlopen(f"{server.base_url}/admin/models", timeout=60) as response:
        return {m["name"]: m for m in json.loads(response.read())["models"]}


def ask(server, model: str) -> str:
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.create(model=model, messages=HI, max_tokens=3, temperature=0).choices[0].message.content


@pytest.fixture(scope="module")
def server(gguf_engine, tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    for name in ("alpha", "beta"):
        copy_engine(gguf_engine, engines, name)
    common = ("--worker.kv-cache-bytes", str(KV_BYTES), "--memory.reserve-bytes", "0",
              "--memory.overhead-bytes", "0", "--scheduling.preload", "pinned")
    probe = start_server(engines, tmp_path_factory.mktemp("probe") / "server.log", *common)
    try:
        ask(probe, "alpha")
        footprint = models(probe)["alpha"]["memory_bytes"]
    finally:
        probe.stop()
    capacity = int(footprint * 1.5)  # one fits, two never do
    proc = start_server(engines, tmp_path_factory.mktemp("server") / "server.log", *common,
                        "--memory.capacity-bytes", str(capacity))
    yield proc
    proc.stop()


def test_load_on_demand_then_evict_the_least_recently_used(server):
    assert {name: m["state"] for name, m in models(server).items()} == {"alpha": "unloaded", "beta": "unloaded"}
    assert ask(server, "alpha")
    alpha = models(server)["alpha"]
    assert alpha["state"] == "ready" and alpha["memory_bytes"] > 0
    ask(server, "beta")
    after = models(server)
    assert after["beta"]["state"] == "ready" and after["alpha"]["state"] == "unloaded"
    assert after["alpha"]["evictions"] == alpha["evictions"] + 1
    # The evicted worker is gone, its memory with it, or it gave the memory back and beta loaded into it.
    assert not psutil.pid_exists(alpha["pid"]) or after["beta"]["pid"] == alpha["pid"]
    assert ask(server, "alpha") and models(server)["beta"]["state"] == "unloaded"
