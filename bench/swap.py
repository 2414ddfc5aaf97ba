"""`python -m bench.swap`: traffic alternating between two models that do not fit together, so that every
switch evicts one and loads the other. Reports the cold load to first token on an empty device, the swap
time (evict, load, first token) with the spare worker warm and back to back, evictions, and the time to
first token of each model once loaded, for both spare refill policies.

The capacity comes from the engines themselves: a first server loads each model once and reads its footprint
as the ledger counts it, and the measured servers get room for the larger model and half the smaller, never
both. A run in which a swap did not evict measured no swap: it says so and exits with status 1.

    python -m bench.swap [--engines-dir engines] [--models smollm2-135m,smollm2-135m-hf] [--rounds 6] [--osl 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from orchestrator import aio
from orchestrator.bench.cli import stoppable
from orchestrator.bench.prompts import WORDS
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.report import machine, versions, write
from orchestrator.bench.senders import HttpSender, RequestShape
from orchestrator.bench.stats import percentile
from orchestrator.bench.workload import RequestSpec
from orchestrator.launch import ServerProcess, copy_engine, start_server

PROG = "python -m bench.swap"
DEFAULT_MODELS = "smollm2-135m,smollm2-135m-hf"  # the embedded default and its transformers twin
KV_BYTES = 64 * 2**20
SIZING_CAPACITY = 64 * 2**30  # room for both while their footprints are measured


class NoSwap(RuntimeError):
    """A model switch that evicted nothing: the run measured no swap."""


def _admin(server: ServerProcess, path: str = "", method: str = "GET") -> dict:
    request = urllib.request.Request(f"{server.base_url}/admin/models{path}", method=method)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _wait_for_warm_spare(server: ServerProcess, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while _admin(server)["spare_worker"] != "warm":
        if time.monotonic() > deadline:
            raise RuntimeError("the spare worker did not become warm")
        time.sleep(0.2)


class _Client:
    """One request at a time, each with a different short prompt."""

    def __init__(self, server: ServerProcess, osl: int):
        self._sender = HttpSender(server.api, RequestShape(chat=False, ignore_eos=False, temperature=0.0), 300)
        self._osl, self._count = osl, 0

    async def ttft(self, model: str) -> float:
        self._count += 1
        prompt = " ".join(WORDS[(self._count * 7 + i) % len(WORDS)] for i in range(12))
        record: RequestTiming = await self._sender.send(self._sender.prepare(RequestSpec(self._count, model, 12, self._osl), prompt))
        if not record.ok:
            raise RuntimeError(f"{model}: {record.error}")
        return record.ttft

    def close(self) -> None:
        self._sender.close()


def _seconds(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, 4)


def _evictions(server: ServerProcess) -> int:
    return sum(model["evictions"] for model in _admin(server)["models"])


def _ready(server: ServerProcess) -> set[str]:
    return {model["name"] for model in _admin(server)["models"] if model["state"] == "ready"}


async def _swap(server: ServerProcess, client: _Client, model: str) -> float:
    """The first token of `model` while the other one is loaded; raises `NoSwap` unless that evicted it."""
    before = await asyncio.to_thread(_evictions, server)
    ttft = await client.ttft(model)
    after = await asyncio.to_thread(_evictions, server)
    if after - before != 1:
        raise NoSwap(f"asking {model} evicted {after - before} models (want 1): both fit, so nothing was swapped")
    return ttft


async def _pairs(server: ServerProcess, models: list[str], rounds: int, osl: int, warm_spare: bool) -> dict:
    """Each round asks the model not loaded twice: the first request swaps it in, the second finds it loaded."""
    client, swaps = _Client(server, osl), []
    loaded: dict[str, list[float]] = {name: [] for name in models}
    try:
        if not await asyncio.to_thread(_ready, server):
            await client.ttft(models[0])  # an empty device: the first load evicts nothing, so it is no swap
        for _ in range(rounds):
            ready = await asyncio.to_thread(_ready, server)
            model = next(name for name in models if name not in ready)
            if warm_spare:
                await asyncio.to_thread(_wait_for_warm_spare, server)
            swaps.append(await _swap(server, client, model))
            loaded[model].append(await client.ttft(model))
    finally:
        client.close()
    return {
        "swaps": len(swaps), "evictions": len(swaps), "swap_p50_s": _seconds(swaps, 50),
        "swap_p90_s": _seconds(swaps, 90), "swap_max_s": round(max(swaps), 4),
        "ttft_loaded_p50_s": {name: _seconds(values, 50) for name, values in loaded.items()},
    }


async def _cold_loads(server: ServerProcess, model_name: str, rounds: int, osl: int) -> dict:
    """Load to first token on an empty device with a warm spare: unload everything, then ask."""
    client, ttfts = _Client(server, osl), []
    try:
        for _ in range(rounds):
            for model in _admin(server)["models"]:
                if model["state"] == "ready":
                    await asyncio.to_thread(_admin, server, f"/{model['name']}/unload", "POST")
            await asyncio.to_thread(_wait_for_warm_spare, server)
            ttfts.append(await client.ttft(model_name))
    finally:
        client.close()
    return {
        "loads": len(ttfts), "load_to_first_token_p50_s": _seconds(ttfts, 50),
        "load_to_first_token_p99_s": _seconds(ttfts, 99), "load_to_first_token_min_s": round(min(ttfts), 4),
    }


def _start(engines: Path, log: Path, refill: str, capacity: int) -> ServerProcess:
    return start_server(
        engines, log, "--worker.kv-cache-bytes", str(KV_BYTES), "--worker.spare-refill", refill,
        "--memory.capacity-bytes", str(capacity), "--memory.reserve-bytes", "0",
        "--scheduling.preload", "pinned", "--scheduling.queue-timeout-s", "120",
    )


async def footprints(engines: Path, models: list[str], workdir: Path, osl: int) -> dict[str, int]:
    """Each model's footprint as the ledger counts it once loaded, with room for both."""
    server = _start(engines, workdir / "swap-sizing.log", "when-idle", SIZING_CAPACITY)
    client = _Client(server, osl)
    try:
        for model in models:
            await client.ttft(model)
        return {m["name"]: m["memory_bytes"] for m in _admin(server)["models"] if m["name"] in models}
    finally:
        client.close()
        server.stop()


def capacity_for(sizes: dict[str, int]) -> int:
    """Room for the larger model and half the smaller: either fits alone, never both."""
    larger, smaller = max(sizes.values()), min(sizes.values())
    if smaller <= 0:
        raise NoSwap(f"a model's footprint was not measured ({sizes}): no capacity can force a swap")
    return larger + smaller // 2


async def run_swap(sources: list[Path], workdir: Path, rounds: int, osl: int) -> dict:
    engines = workdir / "engines"
    engines.mkdir(parents=True, exist_ok=True)
    for source in sources:
        copy_engine(source, engines, source.name)
    models = [source.name for source in sources]
    sizes = await footprints(engines, models, workdir, osl)
    capacity = capacity_for(sizes)
    report = {"models": models, "footprint_bytes": sizes, "capacity_bytes": capacity, "kv_cache_bytes": KV_BYTES}
    # The spare refill policy trades swap time against interference with the requests after a swap.
    for refill in ("when-idle", "after-load"):
        server = _start(engines, workdir / f"swap-{refill}.log", refill, capacity)
        try:
            variant = {}
            if refill == "when-idle":
                variant["cold_load_empty_device"] = await _cold_loads(server, models[0], rounds, osl)
                variant["swaps_with_warm_spare"] = await _pairs(server, models, rounds, osl, warm_spare=True)
            variant["swaps_back_to_back"] = await _pairs(server, models, rounds, osl, warm_spare=False)
            variant["evictions"] = {m["name"]: m["evictions"] for m in _admin(server)["models"]}
        finally:
            server.stop()
        report[f"spare_refill_{refill}"] = variant
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Two models that do not fit together taking turns: cold loads, swaps, evictions.",
    )
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    parser.add_argument("--models", default=DEFAULT_MODELS, help="two engines, comma-separated, taking turns")
    parser.add_argument("--rounds", type=int, default=6, help="model switches per variant")
    parser.add_argument("--osl", type=int, default=16, help="output tokens per request")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    sources = [args.engines_dir / name for name in args.models.split(",")]
    if len(sources) != 2 or sources[0].name == sources[1].name:
        print(f"{PROG}: error: --models names two different engines (got {args.models!r})", file=sys.stderr)
        return 2
    for engine in sources:
        if not (engine / "engine.json").is_file():
            print(f"{PROG}: error: no engine at {engine}", file=sys.stderr)
            return 2
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="inferno-bench-swap-") as workdir:
        try:
            result = aio.run(stoppable(run_swap(sources, Path(workdir), args.rounds, args.osl)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print(f"{PROG}: stopped; no result written", file=sys.stderr)
            return 130
        except NoSwap as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 1
    report = {"schema": "inferno-bench-swap/1", "command": [*PROG.split(), *argv], "started_at": started,
              "engines": [str(engine) for engine in sources], "osl": args.osl, "machine": machine(), "versions": versions(), "swap": result}
    path = write(report, args.out, prefix="swap")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
