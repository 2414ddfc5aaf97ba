"""What a run sends, decided before it starts and from a seed: which model, how long a prompt, how many
output tokens and, in open loop, when. Pure functions over plain values and a seeded random generator."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(frozen=True)
class RequestSpec:
    index: int
    model: str
    isl: int  # prompt tokens asked for
    osl: int  # output tokens asked for (max_tokens)
    at_s: float | None = None  # arrival time from the start of the level (open loop and traces)


@dataclass(frozen=True)
class LengthDist:
    """Fixed lengths, or lognormal around a mean (a chat-like long tail), clipped to [low, high]."""

    mean: int
    sigma: float = 0.0  # 0: every request gets `mean`
    low: int = 1
    high: int | None = None  # default 4 x mean

    def __post_init__(self) -> None:
        if self.mean < 1:
            raise ValueError(f"a mean length must be at least 1 token (got {self.mean})")
        if self.sigma < 0:
            raise ValueError(f"--length-sigma must not be negative (got {self.sigma})")

    @property
    def upper(self) -> int:
        return self.high if self.high is not None else 4 * self.mean

    def sample(self, rng: random.Random) -> int:
        if self.sigma == 0:
            return self.mean
        mu = math.log(self.mean) - self.sigma**2 / 2  # so that the unclipped mean is `mean`
        return max(self.low, min(self.upper, round(rng.lognormvariate(mu, self.sigma))))

    def describe(self) -> dict:
        if self.sigma == 0:
            return {"kind": "fixed", "tokens": self.mean}
        return {"kind": "lognormal", "mean": self.mean, "sigma": self.sigma, "clip": [self.low, self.upper]}


@dataclass(frozen=True)
class ModelMix:
    """Which model each request goes to: round-robin, or weighted random when any weight is given."""

    names: tuple[str, ...]
    weights: tuple[float, ...] | None = None

    @classmethod
    def parse(cls, items: list[str]) -> ModelMix:
        """From ["a,b"] or ["a:3", "b:1"] (repeatable, comma-separated; name or name:weight)."""
        names, weights = [], []
        for item in (part.strip() for text in items for part in text.split(",")):
            if not item:
                continue
            name, _, weight = item.partition(":")
            value = float(weight) if weight else None
            if value is not None and value <= 0:
                raise ValueError(f"--model {item}: a weight must be positive")
            names.append(name)
            weights.append(value)
        if len(set(names)) != len(names):
            raise ValueError(f"--model names a model twice: {','.join(names)}")
        if not any(w is not None for w in weights):
            return cls(tuple(names))
        return cls(tuple(names), tuple(1.0 if w is None else w for w in weights))

    def pick(self, index: int, rng: random.Random) -> str:
        if self.weights is None:
            return self.names[index % len(self.names)]
        return rng.choices(self.names, self.weights)[0]

    def describe(self) -> dict:
        return {"models": list(self.names), "weights": list(self.weights) if self.weights else "round-robin"}


def poisson_arrivals(rate: float, rng: random.Random, count: int | None = None, duration_s: float | None = None) -> list[float]:
    """Arrival times (seconds from 0) of a Poisson process of `rate` per second: `count` of them, or all
    those before `duration_s`. Exponential gaps from `rng`, so a seed gives the same schedule."""
    if rate <= 0:
        raise ValueError(f"--rate must be positive (got {rate})")
    if (count is None) == (duration_s is None):
        raise ValueError("give either a request count or a duration")
    arrivals, now = [], 0.0
    while True:
        now += rng.expovariate(rate)
        if (count is not None and len(arrivals) >= count) or (duration_s is not None and now >= duration_s):
            return arrivals
        arrivals.append(now)


def plan_requests(
    count: int, mix: ModelMix, isl: LengthDist, osl: LengthDist, seed: int, arrivals: list[float] | None = None
) -> list[RequestSpec]:
    """`count` requests drawn from one generator seeded with `seed` (arrival times as given, if any)."""
    rng = random.Random(seed)
    return [
        RequestSpec(i, mix.pick(i, rng), isl.sample(rng), osl.sample(rng), None if arrivals is None else arrivals[i])
        for i in range(count)
    ]


def read_trace(path: Path, default_model: str) -> list[RequestSpec]:
    """A JSONL trace, one request a line: {"t": seconds, "model": name, "isl": n, "osl": n} ("model" is
    optional). Sorted by arrival. Raises ValueError naming the line and field at fault."""
    specs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
            at, isl, osl = float(entry["t"]), int(entry["isl"]), int(entry["osl"])
            model = str(entry.get("model") or default_model)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{number}: expected {{\"t\", \"isl\", \"osl\"[, \"model\"]}} ({exc})") from exc
        if at < 0 or isl < 1 or osl < 1:
            raise ValueError(f"{path}:{number}: t must be >= 0 and isl, osl >= 1 (got t={at}, isl={isl}, osl={osl})")
        specs.append((at, model, isl, osl))
    if not specs:
        raise ValueError(f"{path}: the trace holds no requests")
    specs.sort(key=lambda s: s[0])
    return [RequestSpec(i, model, isl, osl, at) for i, (at, model, isl, osl) in enumerate(specs)]
