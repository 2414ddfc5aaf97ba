"""Whether a sampled series grows without bound: pure judgements over plain numbers.

Two judgements, each with its reason:

- **Growth under traffic** (`judge_growth`): the samples taken while traffic ran are split into thirds (the
  first third is left to settle); over the last two thirds the least-squares line's rise (slope times their
  span) and the step from the middle third's median to the last third's must both stay within the series'
  tolerance, max(relative * the middle third's median, absolute). A leak rises steadily and fails both; a
  flat series whose value only swings with the load passes.
- **Back to idle** (`judge_return`): once traffic has stopped and the server is quiet again, the value is at
  most its idle baseline (taken the same way after the warm-up) plus a slack. Each quiet period's value is
  its lowest sample (series.py says why).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIN_SAMPLES_PER_THIRD = 3


@dataclass(frozen=True)
class Tolerance:
    """How much a series may rise over the last two thirds of the traffic: the larger of a fraction of its
    level and an absolute amount (in the series' unit)."""

    relative: float
    absolute: float

    def allowed(self, level: float) -> float:
        return max(self.relative * abs(level), self.absolute)

    def describe(self, unit: str) -> str:
        amount = f"{self.absolute / 2**20:g} MiB" if unit == "bytes" else f"{self.absolute:g}"
        return f"< {self.relative:.0%} or < {amount}"


MiB = 2**20
# metric -> tolerance under traffic. RSS: allocator caches and fragmentation settle slowly, a leak does not
# stop; counts swing with the requests in flight, so their allowance is above one burst's swing.
TOLERANCES = {
    "rss_bytes": Tolerance(0.05, 20 * MiB),
    "fds": Tolerance(0.10, 8),
    "threads": Tolerance(0.10, 4),
    "tasks": Tolerance(0.10, 16),
}
# metric -> how far above its idle baseline the quiet value may be once traffic stopped.
RETURN_SLACK = {"fds": 0, "tasks": 0}


@dataclass(frozen=True)
class Growth:
    samples: int
    middle_median: float | None
    last_median: float | None
    fitted_rise: float | None  # slope * span over the last two thirds
    slope_per_hour: float | None
    allowed: float | None
    passed: bool
    reason: str


@dataclass(frozen=True)
class Return:
    baseline: float
    end: float
    allowed: float
    passed: bool
    reason: str


def slope(times: list[float], values: list[float]) -> float:
    """Least-squares slope of values over times (0 when the times do not vary)."""
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread


def judge_growth(times: list[float], values: list[float], tolerance: Tolerance, unit: str = "") -> Growth:
    """Growth over the last two thirds of a series sampled under traffic (times in seconds, ascending)."""
    count = len(values)
    third = count // 3
    if third < MIN_SAMPLES_PER_THIRD:
        return Growth(count, None, None, None, None, None, False,
                      f"{count} samples: too few to judge (at least {3 * MIN_SAMPLES_PER_THIRD})")
    middle, last = values[count - 2 * third : count - third], values[count - third :]
    span_t, span_v = times[count - 2 * third :], values[count - 2 * third :]
    rate = slope(span_t, span_v)
    fitted = rate * (span_t[-1] - span_t[0])
    middle_median, last_median = statistics.median(middle), statistics.median(last)
    step = last_median - middle_median
    allowed = tolerance.allowed(middle_median)
    passed = fitted <= allowed and step <= allowed
    reason = (
        f"rose {_amount(fitted, unit)} over the last two thirds (fit), {_amount(step, unit)} median to median; "
        f"allowed {_amount(allowed, unit)}"
    )
    return Growth(count, middle_median, last_median, fitted, rate * 3600, allowed, passed, reason)


def judge_return(baseline: float, end: float, slack: float, unit: str = "") -> Return:
    """The quiet value after traffic against the idle baseline before it."""
    allowed = baseline + slack
    passed = end <= allowed
    verb = "back to" if end <= baseline else ("within slack of" if passed else "above")
    reason = f"{_amount(end, unit)} idle after traffic, {verb} the idle baseline {_amount(baseline, unit)}"
    if slack:
        reason += f" (slack {_amount(slack, unit)})"
    return Return(baseline, end, allowed, passed, reason)


def _amount(value: float, unit: str) -> str:
    return f"{value / MiB:.1f} MiB" if unit == "bytes" else f"{round(value, 1):g}"
