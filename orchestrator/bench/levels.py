"""The levels of a run and the requests of each, decided once and shared by every series (the target,
the in-process backend, the bare SSE server), so that all of them get the same load shape."""

from __future__ import annotations

import random
from dataclasses import dataclass

from orchestrator.bench.options import BenchOptions
from orchestrator.bench.workload import ModelMix, RequestSpec, plan_requests, poisson_arrivals, read_trace

WARMUP_SEED_OFFSET = 1_000_000


@dataclass(frozen=True)
class Level:
    load: dict  # {"concurrency": 4} | {"rate": 5.0} | {"trace": "file.jsonl"}
    specs: list[RequestSpec]
    concurrency: int | None = None  # closed loop
    arrivals: list[float] | None = None  # open loop: send times from the start of the level

    @property
    def label(self) -> str:
        (key, value), = self.load.items()
        return {"concurrency": f"c={value}", "rate": f"{value:g}/s", "trace": "trace"}[key]


def plan_levels(options: BenchOptions, mix: ModelMix) -> tuple[list[Level], list[str]]:
    """Closed-loop levels, then open-loop ones (or the trace); and notes for the result file."""
    if options.trace is not None:
        specs = read_trace(options.trace, mix.names[0])
        return [Level({"trace": str(options.trace)}, specs, arrivals=[s.at_s for s in specs])], []
    levels, notes = [], []
    count = options.requests or options.max_requests
    for number, concurrency in enumerate(options.concurrency):
        specs = plan_requests(count, mix, options.isl, options.osl, options.seed + 1000 * number)
        levels.append(Level({"concurrency": concurrency}, specs, concurrency=concurrency))
    for number, rate in enumerate(options.rates, len(options.concurrency)):
        seed = options.seed + 1000 * number
        rng = random.Random(seed + 1)
        if options.duration_s is None:
            arrivals = poisson_arrivals(rate, rng, count=options.requests)
        else:
            arrivals = poisson_arrivals(rate, rng, duration_s=options.duration_s)
            if len(arrivals) > options.max_requests:
                notes.append(f"rate {rate:g}/s: {len(arrivals)} arrivals in {options.duration_s} s, "
                             f"cut to --max-requests {options.max_requests}")
                arrivals = arrivals[: options.max_requests]
        specs = plan_requests(len(arrivals), mix, options.isl, options.osl, seed, arrivals)
        levels.append(Level({"rate": rate}, specs, arrivals=arrivals))
    return levels, notes


def warmup_specs(options: BenchOptions, models: list[str]) -> list[RequestSpec]:
    """`--warmup` requests for each model, round-robin, sent one at a time before any level."""
    mix = ModelMix(tuple(models))
    return plan_requests(options.warmup * len(models), mix, options.isl, options.osl, options.seed + WARMUP_SEED_OFFSET)
