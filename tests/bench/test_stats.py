"""Percentiles, distributions, SLOs and the summary of one level, with plain values."""

from __future__ import annotations

import pytest

from orchestrator.bench.load import LevelRun
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.stats import Slo, distribution, percentile
from orchestrator.bench.summary import summarise


def test_percentile_interpolates_between_closest_ranks():
    values = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)


def test_percentile_of_one_value_and_of_none():
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile([1.0], 101)


def test_distribution_reports_quantiles_mean_and_count():
    summary = distribution([0.1, 0.2, 0.3, 0.4, 1.0])
    assert summary == {"p50": 0.3, "p90": 0.76, "p99": 0.976, "mean": 0.4, "n": 5}
    assert distribution([])["p50"] is None


def test_slo_parse_and_refusals():
    slo = Slo.parse("ttft=0.5,itl=0.05")
    assert (slo.ttft_s, slo.itl_s, slo.e2e_s) == (0.5, 0.05, None)
    with pytest.raises(ValueError, match="ttft=S"):
        Slo.parse("tpot=1")
    with pytest.raises(ValueError, match="positive"):
        Slo.parse("ttft=0")


def _record(sent: float, times: list[float], end: float, tokens: int | None = None, error: str | None = None):
    return RequestTiming("m", sent, list(times), end, tokens, 10, len(times) + 1, error)


def test_slo_checks_ttft_and_the_requests_own_mean_itl():
    slo = Slo(ttft_s=0.5, itl_s=0.05)
    assert slo.met_by(_record(0.0, [0.4, 0.44, 0.48], 0.5))
    assert not slo.met_by(_record(0.0, [0.6, 0.61], 0.7))  # first token too late
    assert not slo.met_by(_record(0.0, [0.1, 0.2, 0.3], 0.4))  # 100 ms between chunks
    assert not slo.met_by(_record(0.0, [0.1], 0.2, error="HTTP 500"))
    assert slo.met_by(_record(0.0, [0.1], 0.2))  # one chunk: no inter-chunk latency to miss


def test_summary_counts_errors_and_measures_only_successes():
    records = [
        _record(0.0, [0.1, 0.2, 0.3], 0.3, tokens=3),
        _record(0.0, [0.2, 0.4], 0.4, tokens=2),
        _record(0.0, [], 0.1, error="HTTP 429: queue full"),
        _record(0.0, [], 0.1, error="HTTP 429: queue full"),
    ]
    row = summarise(LevelRun(records, wall_s=2.0, client_cpu_s=0.001), {"concurrency": 2}, Slo(ttft_s=0.15))
    assert (row["requests"], row["ok"], row["errors"]) == (4, 2, 2)
    assert row["error_messages"] == [{"count": 2, "message": "HTTP 429: queue full"}]
    assert row["output_tokens"] == 5 and row["output_tok_s"] == 2.5 and row["req_s"] == 1.0
    assert row["ttft_s"]["n"] == 2 and row["ttft_s"]["p50"] == pytest.approx(0.15)
    assert row["itl_s"]["n"] == 3 and row["itl_s"]["p50"] == pytest.approx(0.1)  # gaps 0.1, 0.1 and 0.2
    assert row["goodput"]["requests"] == 1 and row["goodput"]["fraction"] == 0.25
    assert row["client"]["events"] == 4 + 3 + 1 + 1  # every record's events, failed ones included
    assert row["client"]["cpu_us_per_chunk"] == pytest.approx(1000 / 9, abs=0.01)


def test_summary_falls_back_to_chunks_when_the_server_sends_no_usage():
    row = summarise(LevelRun([_record(0.0, [0.1, 0.2], 0.2)], 1.0, 0.0), {"rate": 1.0}, Slo())
    assert row["output_tokens"] == 2
    assert row["output_tokens_from"] == "chunks (no usage sent)"
    assert "goodput" not in row


def test_a_client_whose_loop_stalls_measures_it_and_says_so():
    """The level times its own event loop: a client that blocks it (here 60 ms once, in a 0.2 s level) reads every
    stream late, and the row says how much of the time it was stalled, with a note once that is 1% or more."""
    import asyncio
    import time

    from orchestrator.bench.load import run_closed
    from orchestrator.bench.summary import client_stalls

    async def send(blocks: bool) -> RequestTiming:
        sent = time.perf_counter()
        await asyncio.sleep(0.1)
        if blocks:
            time.sleep(0.06)
        return _record(sent, [sent + 0.05, sent + 0.1], sent + 0.1, tokens=2)

    run = asyncio.run(run_closed(send, [True, False], 1))
    assert max(run.loop_lag_s) >= 0.05 and len(run.loop_lag_s) >= 20
    stalled = summarise(run, {"concurrency": 1}, Slo())
    assert stalled["client"]["stalled_fraction"] >= 0.2
    assert "stalled" in client_stalls(stalled | {"series": "http"})
    calm = summarise(asyncio.run(run_closed(send, [False, False], 1)), {"concurrency": 1}, Slo())
    assert calm["client"]["stalled_fraction"] < stalled["client"]["stalled_fraction"] / 2
    assert client_stalls(stalled | {"series": "http", "client": {"stalled_fraction": 0.009}}) is None  # under 1%
