"""The sim's load time from its spec: a cold load takes `load_s`; one whose weights the server kept in host RAM takes
the runtime's start plus the weights over the engine's GPUs' host links, never longer than a cold one. Engines built
before those two parameters existed load with their defaults."""

from __future__ import annotations

import json

import pytest

from orchestrator.backends.sim.spec import INIT_S, SIM_FILE, load_sim_spec


def test_a_kept_engine_loads_its_weights_over_the_host_links(fast_engine_dir):
    spec = load_sim_spec(fast_engine_dir).model_copy(update={"load_s": 10.0, "init_s": 1.0, "host_link_bytes_s": 50e9})
    assert spec.load_seconds(16e9, 55e9, 1, weights_kept=False) == 10.0
    assert spec.load_seconds(16e9, 55e9, 1, weights_kept=True) == pytest.approx(1.0 + 16e9 / 50e9)
    assert spec.load_seconds(16e9, 55e9, 4, weights_kept=True) == pytest.approx(1.0 + 16e9 / 200e9)  # TP 4: 4 links
    assert spec.load_seconds(900e9, 55e9, 1, weights_kept=True) == 10.0  # never slower than a cold load


def test_an_engine_built_before_kept_engines_loads_with_the_defaults(fast_engine_dir, tmp_path):
    raw = json.loads((fast_engine_dir / SIM_FILE).read_text())
    del raw["init_s"], raw["host_link_bytes_s"]
    (tmp_path / SIM_FILE).write_text(json.dumps({**raw, "load_s": 30.0}))
    spec = load_sim_spec(tmp_path)
    assert (spec.init_s, spec.host_link_bytes_s) == (INIT_S, None)
    assert spec.load_seconds(55e9, 55e9, 1, weights_kept=True) == pytest.approx(INIT_S + 1.0)  # the GPU's link
