"""bench/cpu_split.py: user and system time apart, per thread name, against the tokens the server counted."""

from __future__ import annotations

import os
import threading

from bench import cpu_split


def test_a_stat_line_is_split_after_the_last_parenthesis_of_its_name():
    fields = ["S"] + ["0"] * 10 + ["1234", "567"] + ["0"] * 30  # state, then utime (14th) and stime (15th)
    assert cpu_split.user_system_ticks("42 (a (b) c) " + " ".join(fields)) == ("a (b) c", 1234, 567)


def test_tokens_are_summed_over_every_models_series_and_nothing_else():
    text = "\n".join([
        "# HELP inferno_generation_tokens_total Tokens generated, all choices counted.",
        "# TYPE inferno_generation_tokens_total counter",
        'inferno_generation_tokens_total{model="a"} 1000.0',
        'inferno_generation_tokens_total{model="b"} 24.0',
        'inferno_generation_tokens_created{model="a"} 1.7e9',
        'inferno_prompt_tokens_total{model="a"} 99.0',
    ])
    assert cpu_split.tokens_counted(text) == 1024.0


def test_the_difference_of_two_samples_is_given_per_token_for_what_both_saw():
    before = {(1, "process"): (100, 10), (1, "python"): (90, 9), (2, "gone"): (5, 5)}
    after = {(1, "process"): (200, 30), (1, "python"): (150, 29), (3, "new"): (7, 7)}
    rows = cpu_split.split(before, after, tokens=100 * 1e6 / cpu_split.TICKS_PER_S)  # 100 ticks: 1 µs per token
    assert [(r["pid"], r["thread"]) for r in rows] == [(1, "process"), (1, "python")]
    assert (rows[0]["user_us_per_token"], rows[0]["system_us_per_token"]) == (1.0, 0.2)
    assert (rows[1]["user_us_per_token"], rows[1]["system_us_per_token"]) == (0.6, 0.2)


def test_a_real_process_is_sampled_with_its_named_threads():
    started, stop = threading.Event(), threading.Event()

    def busy():
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=busy, name="split-test")
    thread.start()
    started.wait(10)
    try:
        samples = cpu_split.sample(os.getpid())
    finally:
        stop.set()
        thread.join()
    names = {name for pid, name in samples if pid == os.getpid()}
    assert "process" in names and len(names) >= 2  # the whole process and its threads by their comm
    user, system = samples[(os.getpid(), "process")]
    assert user + system > 0  # this interpreter has run
