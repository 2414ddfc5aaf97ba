"""One row of results from one level's records: latencies, throughput, goodput, errors, client cost."""

from __future__ import annotations

from collections import Counter

from orchestrator.bench.load import LevelRun
from orchestrator.bench.stats import Slo, distribution

STALL_S = 0.010  # the client's loop this late or later is a stall: every stream's chunk waits that long
STALLED_NOTE = 0.01  # stalled this share of a level (as many chunks as a p99 counts), the row gets a note


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarise(run: LevelRun, load: dict, slo: Slo) -> dict:
    """The row for one level. Failed requests are counted and their messages kept (most common first);
    latencies and tokens come from the requests that succeeded."""
    ok = [r for r in run.records if r.ok]
    failed = Counter(r.error for r in run.records if not r.ok)
    tokens = sum(r.tokens for r in ok)
    wall = run.wall_s
    events = sum(r.events for r in run.records)
    row = {
        "load": load,
        "requests": len(run.records),
        "ok": len(ok),
        "errors": sum(failed.values()),
        "error_messages": [{"count": n, "message": m} for m, n in failed.most_common(5)],
        "wall_s": _rounded(wall),
        "stopped": run.stopped,
        "output_tokens": tokens,
        "output_tokens_from": "usage" if all(r.output_tokens is not None for r in ok) else "chunks (no usage sent)",
        "output_tok_s": _rounded(tokens / wall if wall else None, 2),
        "req_s": _rounded(len(ok) / wall if wall else None, 3),
        "ttft_s": distribution([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": distribution([gap for r in ok for gap in r.gaps]),
        "tpot_s": distribution([r.mean_itl for r in ok if r.mean_itl is not None]),
        "e2e_s": distribution([r.e2e for r in ok if r.e2e is not None]),
        "prompt_tokens": distribution([r.prompt_tokens for r in ok if r.prompt_tokens is not None], 1),
        "output_tokens_per_request": distribution([r.tokens for r in ok], 1),
        "chunks": sum(len(r.token_times) for r in ok),
        "client": {"cpu_s": _rounded(run.client_cpu_s, 4),
                   "cpu_us_per_chunk": _rounded(run.client_cpu_s * 1e6 / events if events else None, 2),
                   "events": events, "max_in_flight": run.max_in_flight,
                   "send_lag_s": distribution(run.send_lag_s) if run.send_lag_s else None,
                   "loop_lag_s": distribution(run.loop_lag_s),
                   "stalled_fraction": _rounded(sum(lag for lag in run.loop_lag_s if lag >= STALL_S) / wall
                                                if wall else None, 4)},
    }
    if slo.as_dict() != Slo().as_dict():
        met = sum(1 for r in run.records if slo.met_by(r))
        row["goodput"] = {"slo": slo.as_dict(), "requests": met,
                          "req_s": _rounded(met / wall if wall else None, 3),
                          "fraction": _rounded(met / len(run.records) if run.records else None, 4)}
    return row


def client_stalls(row: dict) -> str | None:
    """A note where the client's event loop was stalled (STALL_S late or more) for STALLED_NOTE of the level:
    chunks arriving then are read late, so at that share its own stalls can make the ITL p99 it measured."""
    stalled, itl = row.get("client", {}).get("stalled_fraction"), row.get("itl_s", {}).get("p99")
    if not stalled or stalled < STALLED_NOTE or itl is None:
        return None
    (key, value), = row["load"].items()
    return (f"{row['series']} at {key} {value}: the client's event loop was stalled {stalled:.1%} of "
            f"the time (its timer {STALL_S * 1e3:.0f} ms late or more); at that share its own stalls can make "
            f"the ITL p99 of {itl * 1e3:.1f} ms (a client on the server's cores, or one process reading too "
            "many streams)")
