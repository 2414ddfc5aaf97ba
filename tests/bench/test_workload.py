"""Seeded schedules, length distributions, model mixes and traces; the floor's burst they make."""

from __future__ import annotations

import random
import statistics

import pytest

from orchestrator.bench.floor import SOCKETS
from orchestrator.bench.options import parse_options
from orchestrator.bench.workload import LengthDist, ModelMix, plan_requests, poisson_arrivals, read_trace


def test_poisson_schedule_is_seeded():
    first = poisson_arrivals(10.0, random.Random(7), count=50)
    assert first == poisson_arrivals(10.0, random.Random(7), count=50)
    assert first != poisson_arrivals(10.0, random.Random(8), count=50)
    assert len(first) == 50 and first == sorted(first) and first[0] > 0


def test_poisson_schedule_has_the_asked_mean_rate():
    arrivals = poisson_arrivals(25.0, random.Random(1), count=20_000)
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 25.0, rel=0.03)
    # exponential gaps: the standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / 25.0, rel=0.05)


def test_poisson_schedule_by_duration():
    arrivals = poisson_arrivals(50.0, random.Random(3), duration_s=100.0)
    assert all(t < 100.0 for t in arrivals)
    assert len(arrivals) == pytest.approx(5000, rel=0.05)
    with pytest.raises(ValueError, match="either"):
        poisson_arrivals(1.0, random.Random(0))


def test_fixed_lengths():
    dist = LengthDist(128)
    assert {dist.sample(random.Random(i)) for i in range(10)} == {128}
    assert dist.describe() == {"kind": "fixed", "tokens": 128}


def test_lognormal_lengths_are_seeded_clipped_and_centred_on_the_mean():
    dist = LengthDist(200, sigma=0.6)
    rng = random.Random(5)
    samples = [dist.sample(rng) for _ in range(20_000)]
    assert samples[:20] == [dist.sample(r) for r in [random.Random(5)] for _ in range(20)]
    assert min(samples) >= 1 and max(samples) <= 800
    assert statistics.fmean(samples) == pytest.approx(200, rel=0.05)
    assert statistics.median(samples) < 200  # a long right tail, as chat lengths have
    assert len(set(samples)) > 100


def test_model_mix_round_robin_and_weighted():
    mix = ModelMix.parse(["a,b", "c"])
    assert mix.weights is None
    assert [mix.pick(i, random.Random(0)) for i in range(4)] == ["a", "b", "c", "a"]
    weighted = ModelMix.parse(["a:3,b:1"])
    rng = random.Random(2)
    picks = [weighted.pick(i, rng) for i in range(8000)]
    assert picks.count("a") / len(picks) == pytest.approx(0.75, abs=0.02)
    with pytest.raises(ValueError, match="twice"):
        ModelMix.parse(["a,a"])
    with pytest.raises(ValueError, match="positive"):
        ModelMix.parse(["a:0"])


def test_plan_requests_is_reproducible():
    mix, isl, osl = ModelMix(("a", "b")), LengthDist(64, 0.5), LengthDist(32, 0.5)
    assert plan_requests(20, mix, isl, osl, 11) == plan_requests(20, mix, isl, osl, 11)
    assert plan_requests(20, mix, isl, osl, 11) != plan_requests(20, mix, isl, osl, 12)


def test_trace_is_read_sorted_and_checked(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0.5, "model": "b", "isl": 10, "osl": 5}\n\n{"t": 0.1, "isl": 20, "osl": 6}\n')
    specs = read_trace(trace, "a")
    assert [(s.at_s, s.model, s.isl, s.osl) for s in specs] == [(0.1, "a", 20, 6), (0.5, "b", 10, 5)]
    trace.write_text('{"t": 0.5, "isl": 10}\n')
    with pytest.raises(ValueError, match=r"trace.jsonl:1"):
        read_trace(trace, "a")


def test_the_floor_is_measured_in_the_bursts_one_engine_step_writes():
    """As many sockets as streams one engine's step writes to at the highest closed-loop level: all of them for
    one model, the busiest model's share for several; a rate or a trace keeps the default burst."""
    def sockets(*flags: str) -> int:
        return parse_options(["--url", "http://x", "--requests", "256", *flags]).floor_sockets()

    assert sockets("--concurrency", "1,4,128") == 128
    assert sockets("--concurrency", "128", "--model", "a,b,c,d") == 32
    assert sockets("--concurrency", "128", "--model", "a:3,b:1") == 96
    assert sockets("--concurrency", "2", "--model", "a,b,c,d") == 1  # never fewer than one
    assert sockets("--rate", "50") == SOCKETS
