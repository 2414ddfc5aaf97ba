"""The swap benchmark sizes its capacity so that either model fits alone and never both, and a run that
measured no swap fails with a message instead of writing a result."""

from __future__ import annotations

import pytest

from bench import swap


def test_capacity_fits_either_model_alone_and_never_both():
    sizes = {"small": 794_390_528, "large": 1_037_606_912}
    capacity = swap.capacity_for(sizes)
    assert all(size <= capacity for size in sizes.values())
    assert sum(sizes.values()) > capacity


def test_an_unmeasured_footprint_cannot_size_a_swap():
    with pytest.raises(swap.NoSwap):
        swap.capacity_for({"small": 0, "large": 1_000})


def test_a_run_without_an_eviction_fails_and_writes_nothing(tmp_path, monkeypatch, capsys):
    engines = tmp_path / "engines"
    for name in ("a", "b"):
        (engines / name).mkdir(parents=True)
        (engines / name / "engine.json").write_text("{}")

    async def no_swap(*_args):
        raise swap.NoSwap("asking a evicted 0 models (want 1): both fit, so nothing was swapped")

    monkeypatch.setattr(swap, "run_swap", no_swap)
    out = tmp_path / "results"
    assert swap.main(["--engines-dir", str(engines), "--models", "a,b", "--out", str(out)]) == 1
    assert "nothing was swapped" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("models", ["a", "a,a", "a,b,c"])
def test_two_different_engines_are_needed(tmp_path, models, capsys):
    assert swap.main(["--engines-dir", str(tmp_path), "--models", models, "--out", str(tmp_path / "r")]) == 2
    assert "two different engines" in capsys.readouterr().err


def test_a_missing_engine_is_named(tmp_path, capsys):
    assert swap.main(["--engines-dir", str(tmp_path), "--models", "a,b", "--out", str(tmp_path / "r")]) == 2
    assert "no engine at" in capsys.readouterr().err
