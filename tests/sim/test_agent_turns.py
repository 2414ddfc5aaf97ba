"""`inferno bench --scenario agent-turns` end to end on a sim engine: real servers, one per variant of the models' settings."""

from __future__ import annotations

import pytest

from orchestrator.bench import agent_turns
from orchestrator.bench.agent_turns import parse, run

pytestmark = pytest.mark.e2e


def test_the_host_tier_keeps_a_conversation_the_device_cache_lost(sim_engine_dir, tmp_path, monkeypatch):
    """Two agents on one model whose KV cache holds one conversation: the second's turn overwrites the first's
    blocks. Without a host tier the first's next turn starts from nothing; with one its history comes back.
    Only the two variants compared here are run (a server each)."""
    compared = ("device only", "host tier")
    monkeypatch.setattr(agent_turns, "VARIANTS", {name: agent_turns.VARIANTS[name] for name in compared})
    scenario = parse([
        "--engines-dir", str(sim_engine_dir.parent), "--model", sim_engine_dir.name, "--models", "1", "--agents", "2",
        "--turns", "2", "--system-words", "200", "--user-words", "40", "--answer-tokens", "8", "--think-s", "1",
        "--kv-cache-bytes", str(400 * 65536 / 2**30), "--host-cache-bytes", "0.25",
    ])
    variants = {variant["name"]: variant["turns"] for variant in run(scenario)["variants"]}
    device_only, host_tier = variants["device only"], variants["host tier"]
    for turns in variants.values():
        assert turns[0]["cached_tokens_mean"] == 0 and turns[1]["requests"] == 2
        assert turns[1]["prompt_tokens_mean"] == device_only[1]["prompt_tokens_mean"]  # the same conversations
    assert device_only[1]["cached_tokens_mean"] < host_tier[1]["cached_tokens_mean"]
    assert host_tier[1]["cached_share"] > 0.5
