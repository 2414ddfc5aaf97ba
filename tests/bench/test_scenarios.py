"""`inferno bench --scenario NAME`: one form for every scenario, each scenario's own options behind it."""

from __future__ import annotations

import pytest

from orchestrator.bench.cli import bench_command
from orchestrator.bench.options import BenchError, scenario_of


def test_the_scenario_is_read_before_its_options():
    assert scenario_of(["--url", "http://x"]) == "levels"
    assert scenario_of(["--scenario", "two-keys", "--url", "http://x"]) == "two-keys"
    assert scenario_of(["--scenario=agent-turns", "--models", "3"]) == "agent-turns"
    with pytest.raises(BenchError, match="--scenario must be one of levels, two-keys, agent-turns"):
        scenario_of(["--scenario", "agent_turns"])


def test_agent_turns_takes_its_own_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_command(["--scenario", "agent-turns", "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert "inferno bench --scenario agent-turns" in shown and "--host-cache-bytes" in shown


def test_an_unknown_scenario_is_refused_naming_the_choices(capsys):
    assert bench_command(["--scenario", "agent_turns", "--url", "http://x"]) == 2
    assert "--scenario must be one of" in capsys.readouterr().err
