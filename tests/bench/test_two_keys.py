"""`inferno bench --scenario two-keys` without a server: its options, and how its result counts 429s."""

from __future__ import annotations

import pytest

from orchestrator.bench.options import BenchError, parse_options
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.two_keys import flood_summary, victim_summary


def test_options_take_one_flood_concurrency_and_no_open_loop():
    options = parse_options(["--scenario", "two-keys", "--url", "http://x", "--concurrency", "32", "--requests", "4"])
    assert (options.scenario, options.concurrency, options.requests, options.victim_osl) == ("two-keys", (32,), 4, 16)
    assert options.as_dict()["victim_key"] is None
    for wrong in (["--concurrency", "8,32"], ["--rate", "5"], ["--duration", "10"], ["--victim-osl", "0"]):
        with pytest.raises(BenchError, match="--scenario two-keys takes one --concurrency"):
            parse_options(["--scenario", "two-keys", "--url", "http://x", *wrong])


def timing(sent: float, first: float | None, error: str | None = None) -> RequestTiming:
    record = RequestTiming("m", sent, token_times=[] if first is None else [first], error=error)
    record.end = None if error else (first or sent) + 1.0
    return record


def test_a_429_is_counted_apart_from_other_errors():
    records = [timing(0.0, 0.2), timing(0.0, 0.4), timing(0.0, None, "HTTP 429: queue_full"),
               timing(0.0, None, "HTTP 500: boom")]
    summary = victim_summary(records)
    assert (summary["ok"], summary["rejected_429"], summary["errors"]) == (2, 1, 1)
    assert summary["ttft_s"]["p50"] == pytest.approx(0.3)
    flood = flood_summary(records, seconds=2.0)
    assert (flood["requests_finished"], flood["rejected_429"], flood["errors"]) == (2, 1, 1)
