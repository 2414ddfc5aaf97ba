"""`python -m bench.swap`: traffic alternating between two models that do not fit together, so that every
switch evicts one and loads the other. Reports the cold load to first token on an empty device, the swap
time (evict, load, first token) with the spare worker warm and back to back, evictions, and the time to
first token of each model once loaded, for both spare refill policies.

    python -m bench.swap [--engines-dir engines] [--model smollm2-135m] [--rounds 6] [--osl 16]
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
MODELS = ("alpha", "beta")
KV_BYTES = 64 * 2**20
CAPACITY = 1_600_000_000  # one SmolLM2 worker with this KV budget (about 1.0 GiB), never two


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


async def _pairs(server: ServerProcess, rounds: int, osl: int, warm_spare: bool) -> dict:
    """Each round asks the other model twice: the first request swaps it in, the second finds it loaded."""
    client, swaps = _Client(server, osl), []
    loaded: dict[str, list[float]] = {name: [] for name in MODELS}
    try:
        for round_index in range(rounds):
            model = MODELS[round_index % 2]
            if warm_spare:
                await asyncio.to_thread(_wait_for_warm_spare, server)
            swaps.append(await client.ttft(model))
            loaded[model].append(await client.ttft(model))
    finally:
        client.close()
    return {
        "swaps": len(swaps), "swap_p50_s": _seconds(swaps, 50), "swap_p99_s": _seconds(swaps, 99),
        "swap_max_s": round(max(swaps), 4),
        "ttft_loaded_p50_s": {name: _seconds(values, 50) for name, values in loaded.items()},
    }


async def _cold_loads(server: ServerProcess, rounds: int, osl: int) -> dict:
    """Load to first token on an empty device with a warm spare: unload everything, then ask."""
    client, ttfts = _Client(server, osl), []
    try:
        for _ in range(rounds):
            for model in _admin(server)["models"]:
                if model["state"] == "ready":
                    await asyncio.to_thread(_admin, server, f"/{model['name']}/unload", "POST")
            await asyncio.to_thread(_wait_for_warm_spare, server)
            ttfts.append(await client.ttft(MODELS[0]))
    finally:
        client.close()
    return {
        "loads": len(ttfts), "load_to_first_token_p50_s": _seconds(ttfts, 50),
        "load_to_first_token_p99_s": _seconds(ttfts, 99), "load_to_first_token_min_s": round(min(ttfts), 4),
    }


def _start(engines: Path, log: Path, refill: str) -> ServerProcess:
    return start_server(
        engines, log, "--worker.kv-cache-bytes", str(KV_BYTES), "--worker.spare-refill", refill,
        "--memory.capacity-bytes", str(CAPACITY), "--memory.reserve-bytes", "0",
        "--scheduling.preload", "pinned", "--scheduling.queue-timeout-s", "120",
    )


async def run_swap(engine: Path, workdir: Path, rounds: int, osl: int) -> dict:
    engines = workdir / "engines"
    engines.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        copy_engine(engine, engines, name)
    report = {"models": list(MODELS), "capacity_bytes": CAPACITY, "kv_cache_bytes": KV_BYTES}
    # The spare refill policy trades swap time against interference with the requests after a swap.
    for refill in ("when-idle", "after-load"):
        server = _start(engines, workdir / f"swap-{refill}.log", refill)
        try:
            variant = {}
            if refill == "when-idle":
                variant["cold_load_empty_device"] = await _cold_loads(server, rounds, osl)
                variant["swaps_with_warm_spare"] = await _pairs(server, rounds, osl, warm_spare=True)
            variant["swaps_back_to_back"] = await _pairs(server, rounds, osl, warm_spare=False)
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
    parser.add_argument("--model", default="smollm2-135m", help="the engine served under two names")
    parser.add_argument("--rounds", type=int, default=6, help="model switches per variant")
    parser.add_argument("--osl", type=int, default=16, help="output tokens per request")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    engine = args.engines_dir / args.model
    if not (engine / "engine.json").is_file():
        print(f"{PROG}: error: no engine at {engine}", file=sys.stderr)
        return 2
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="inferno-bench-swap-") as workdir:
        try:
            result = aio.run(stoppable(run_swap(engine, Path(workdir), args.rounds, args.osl)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print(f"{PROG}: stopped; no result written", file=sys.stderr)
            return 130
    report = {"schema": "inferno-bench-swap/1", "command": [*PROG.split(), *argv], "started_at": started,
              "engine": str(engine), "osl": args.osl, "machine": machine(), "versions": versions(), "swap": result}
    path = write(report, args.out, prefix="swap")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
