"""The soak run's verdict on synthetic series: a leak fails, a flat series that swings with the load passes,
and the quiet checks catch what did not come back to idle."""

from __future__ import annotations

import random

import pytest

from bench.soak.report import failed_reasons, markdown, text_table
from bench.soak.series import steady_processes, verdict
from bench.soak.verdict import TOLERANCES, Tolerance, judge_growth, judge_return

MiB = 2**20
RSS = TOLERANCES["rss_bytes"]


def minutes(count: int, every_s: float = 5.0) -> list[float]:
    return [i * every_s for i in range(count)]


def test_a_steady_leak_fails_even_under_noise():
    rng = random.Random(1)
    times = minutes(360)  # 30 minutes, a sample every 5 s
    leaking = [150 * MiB + t / 60 * 1.5 * MiB + rng.gauss(0, 3 * MiB) for t in times]  # 1.5 MiB a minute
    growth = judge_growth(times, leaking, RSS, "bytes")
    assert not growth.passed
    assert growth.fitted_rise == pytest.approx(1.5 * MiB * 20, rel=0.15)  # the last two thirds: 20 minutes
    assert growth.slope_per_hour == pytest.approx(90 * MiB, rel=0.15)
    assert "allowed 20.0 MiB" in growth.reason


def test_a_flat_noisy_series_passes():
    rng = random.Random(2)
    times = minutes(360)
    flat = [150 * MiB + rng.gauss(0, 5 * MiB) for _ in times]
    growth = judge_growth(times, flat, RSS, "bytes")
    assert growth.passed, growth.reason
    assert abs(growth.fitted_rise) < 5 * MiB


def test_counts_that_swing_with_the_load_pass_and_a_creeping_count_fails():
    rng = random.Random(3)
    times = minutes(240)
    swinging = [17 + rng.randint(0, 14) for _ in times]  # idle 17, up to 14 connections open
    assert judge_growth(times, swinging, TOLERANCES["fds"]).passed
    creeping = [value + i // 10 for i, value in enumerate(swinging)]  # one more fd every 10 samples, never closed
    growth = judge_growth(times, creeping, TOLERANCES["fds"])
    assert not growth.passed
    assert growth.fitted_rise == pytest.approx(16, abs=3)  # 160 samples over the last two thirds


def test_a_one_off_step_within_tolerance_passes_and_one_beyond_fails():
    times = minutes(90)
    stepped = [100 * MiB] * 50 + [110 * MiB] * 40  # an allocator arena taken once, kept
    assert judge_growth(times, stepped, RSS, "bytes").passed
    assert not judge_growth(times, [100 * MiB] * 50 + [130 * MiB] * 40, RSS, "bytes").passed


def test_the_tolerance_is_relative_for_large_processes():
    assert Tolerance(0.05, 20 * MiB).allowed(1000 * MiB) == 50 * MiB
    assert Tolerance(0.05, 20 * MiB).allowed(100 * MiB) == 20 * MiB


def test_too_few_samples_is_no_pass():
    growth = judge_growth(minutes(8), [1.0] * 8, TOLERANCES["fds"])
    assert not growth.passed and "too few" in growth.reason


def test_back_to_idle():
    assert judge_return(17, 17, 0).passed
    assert judge_return(17, 16, 0).passed
    above = judge_return(6, 9, 0)
    assert not above.passed and "9 idle after traffic, above the idle baseline 6" in above.reason
    assert judge_return(6, 7, 1).passed


# -- the whole verdict over samples as the sampler takes them -----------------------------------------------------

def server_sample(http_rss: float, tasks: int, fds: int, in_flight: int, worker_pid: int = 200,
                  swapped_pid: int | None = None) -> dict:
    processes = [
        {"pid": 100, "role": "http", "rss_bytes": http_rss, "fds": fds, "threads": 5},
        {"pid": worker_pid, "role": "worker:hot", "rss_bytes": 90 * MiB, "fds": 17, "threads": 2},
    ]
    if swapped_pid is not None:
        processes.append({"pid": swapped_pid, "role": "worker:pair", "rss_bytes": 95 * MiB, "fds": 17, "threads": 2})
    return {"processes": processes, "children": len(processes) - 1, "tasks": tasks, "in_flight": in_flight}


def run_samples(leak_mib_per_sample: float = 0.0, end_tasks: int = 6, end_in_flight: int = 0,
                worker_restarts: bool = False) -> list[dict]:
    """Warm-up, three idle samples, 60 traffic samples (a swapped worker changing pid every 10), three idle."""
    rng = random.Random(4)
    samples, t = [], 0.0

    def add(phase: str, server: dict) -> None:
        nonlocal t
        samples.append({"t": t, "phase": phase, "servers": {"sim": server}})
        t += 5

    for _ in range(5):
        add("warmup", server_sample(120 * MiB, 20, 27, 4))
    for _ in range(3):
        add("baseline", server_sample(121 * MiB, 6, 17, 0, swapped_pid=300))
    for i in range(60):
        rss = 122 * MiB + rng.gauss(0, MiB) + i * leak_mib_per_sample * MiB
        worker = 201 if worker_restarts and i >= 30 else 200
        add("traffic", server_sample(rss, 18 + rng.randint(0, 8), 25 + rng.randint(0, 5), rng.randint(0, 6),
                                     worker_pid=worker, swapped_pid=300 + i // 10))
    for _ in range(3):
        add("quiet", server_sample(123 * MiB + 60 * leak_mib_per_sample * MiB, end_tasks, 17, end_in_flight,
                                   worker_pid=201 if worker_restarts else 200, swapped_pid=310))
    return samples


def rows_by_name(judged: dict) -> dict[tuple[str, str], dict]:
    return {(row["process"], row["metric"]): row for row in judged["rows"]}


def test_a_run_where_nothing_grows_passes_with_every_series_judged():
    judged = verdict(run_samples(), {"sim": ["hot"]})
    assert judged["passed"], failed_reasons(judged)
    assert set(rows_by_name(judged)) == {
        ("http", "rss_bytes"), ("http", "fds"), ("http", "threads"), ("http", "tasks"),
        ("worker:hot", "rss_bytes"), ("worker:hot", "fds"), ("worker:hot", "threads"),
    }
    tasks = rows_by_name(judged)[("http", "tasks")]
    assert (tasks["baseline"], tasks["end"]) == (6, 6) and tasks["back_to_idle"]["passed"]
    [swapped] = [t for t in judged["transient"] if t["process"] == "worker:pair"]
    assert swapped["processes"] == 7  # pids 300..305 under traffic, 310 after; never judged for growth
    table = text_table(judged)
    assert table.count("\n") == 7 and "asyncio tasks" in table and "FAIL" not in table


def test_a_leaking_http_process_fails_and_says_why():
    judged = verdict(run_samples(leak_mib_per_sample=1.0), {"sim": ["hot"]})
    assert not judged["passed"]
    rss = rows_by_name(judged)[("http", "rss_bytes")]
    assert not rss["passed"] and not rss["growth"]["passed"]
    assert [line for line in failed_reasons(judged) if line.startswith("sim http rss_bytes: rose")]
    assert all(row["passed"] for key, row in rows_by_name(judged).items() if key != ("http", "rss_bytes"))


def test_tasks_left_behind_and_requests_still_in_flight_fail_the_quiet_checks():
    judged = verdict(run_samples(end_tasks=9, end_in_flight=1), {"sim": ["hot"]})
    assert not judged["passed"]
    assert not rows_by_name(judged)[("http", "tasks")]["back_to_idle"]["passed"]
    failed = {check["check"] for check in judged["checks"] if not check["passed"]}
    assert failed == {"requests in flight while quiet"}


def test_a_pinned_worker_that_was_replaced_fails_and_is_not_judged_as_steady():
    samples = run_samples(worker_restarts=True)
    assert ("worker:hot", 200) not in steady_processes(samples, "sim")
    judged = verdict(samples, {"sim": ["hot"]})
    assert not judged["passed"]
    assert [c for c in judged["checks"] if c["check"] == "hot's worker stayed the same process all through"
            and not c["passed"]]


def test_the_markdown_holds_the_table_checks_and_traffic():
    samples = run_samples(leak_mib_per_sample=1.0)
    judged = verdict(samples, {"sim": ["hot"]})
    report = {"started_at": "now", "duration_s": 300, "seed": 7, "sample_s": 5, "samples": samples,
              "machine": {"cpus": 2, "cpu_model": "test"}, "verdict": judged,
              "traffic": {"failures": 0, "servers": {"sim": {"stream": {"sent": 3, "ok": 3, "notes": {},
                                                                         "failures": {}}}}},
              "servers": {"sim": {"log_problems": {"count": 0, "first": []}}}}
    text = markdown(report)
    assert "**Verdict: FAILED**" in text and "seed 7" in text
    assert "| sim | http | RSS MiB |" in text and "## What failed" in text
    timeline = [line for line in text.splitlines() if line.startswith(("| warmup", "| baseline", "| traffic", "| quiet"))]
    assert len(timeline) == 1 + 1 + 10 + 1  # the traffic in tenths
    assert timeline[1] == "| baseline | 0.4-0.6 | 121.0 | 17 | 6 | 90.0 | 17 | 0 |"  # http RSS, fds, tasks; worker RSS, fds
