"""Percentiles, latency distributions and the SLO that decides goodput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.bench.record import RequestTiming


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100) by linear interpolation between closest ranks (numpy's default
    method); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100 (got {q})")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def distribution(values: Sequence[float], digits: int = 6) -> dict:
    """p50, p90, p99 and mean of `values` (None each when there are none), and how many there were."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "n": 0}
    ordered = sorted(values)
    summary = {f"p{q}": round(percentile(ordered, q), digits) for q in (50, 90, 99)}
    summary["mean"] = round(sum(ordered) / len(ordered), digits)
    summary["n"] = len(ordered)
    return summary


@dataclass(frozen=True)
class Slo:
    """A service-level objective per request; a bound left as None is not checked."""

    ttft_s: float | None = None
    itl_s: float | None = None  # bounds the request's own mean inter-chunk latency (RequestTiming.mean_itl)
    e2e_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """From `ttft=0.5,itl=0.05` (seconds; keys ttft, itl, e2e). Raises ValueError naming the bad part."""
        bounds: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            if key not in ("ttft", "itl", "e2e") or not value:
                raise ValueError(f"--slo: expected ttft=S, itl=S or e2e=S (got {part!r})")
            bound = float(value)
            if bound <= 0:
                raise ValueError(f"--slo: {key} must be positive seconds (got {value})")
            bounds[f"{key}_s"] = bound
        return cls(**bounds)

    def as_dict(self) -> dict:
        return {"ttft_s": self.ttft_s, "itl_s": self.itl_s, "e2e_s": self.e2e_s}

    def met_by(self, record: RequestTiming) -> bool:
        """True when the request succeeded and meets every bound. A request with a single output chunk
        has no inter-chunk latency and meets any ITL bound."""
        if not record.ok or record.ttft is None:
            return False
        if self.ttft_s is not None and record.ttft > self.ttft_s:
            return False
        itl = record.mean_itl
        if self.itl_s is not None and itl is not None and itl > self.itl_s:
            return False
        return not (self.e2e_s is not None and (record.e2e is None or record.e2e > self.e2e_s))
