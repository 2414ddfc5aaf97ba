"""Alternating traffic across two models that do not fit together: every switch evicts one and loads the
other. Reports cold load to first token on an empty device, swap time (evict, load, first token) with the
spare worker warm and back to back, evictions, and time to first token per model once loaded."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import aiohttp

from bench.loadgen import request_body, stream_one
from bench.stats import percentile, rounded
from orchestrator.launch import ServerProcess, copy_engine, start_server

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


async def _pairs(server: ServerProcess, rounds: int, max_tokens: int, warm_spare: bool) -> dict:
    """Each round asks the other model twice: the first request swaps it in, the second finds it loaded."""
    swaps: list[float] = []
    loaded: dict[str, list[float]] = {name: [] for name in MODELS}
    url = f"{server.api}/chat/completions"
    async with aiohttp.ClientSession() as session:
        for round_index in range(rounds):
            model = MODELS[round_index % 2]
            if warm_spare:
                await asyncio.to_thread(_wait_for_warm_spare, server)
            for attempt in range(2):
                timing = await stream_one(session, url, request_body(model, round_index, max_tokens))
                if timing.error:
                    raise RuntimeError(f"{model}: {timing.error}")
                (swaps if attempt == 0 else loaded[model]).append(timing.ttft)
    return {
        "swaps": len(swaps),
        "swap_p50_s": rounded(percentile(swaps, 50)),
        "swap_p99_s": rounded(percentile(swaps, 99)),
        "swap_max_s": rounded(max(swaps)),
        "ttft_loaded_p50_s": {name: rounded(percentile(values, 50)) for name, values in loaded.items()},
    }


async def _cold_loads(server: ServerProcess, rounds: int, max_tokens: int) -> dict:
    """Load to first token on an empty device with a warm spare: unload everything, then ask."""
    ttfts: list[float] = []
    url = f"{server.api}/chat/completions"
    async with aiohttp.ClientSession() as session:
        for round_index in range(rounds):
            for model in _admin(server)["models"]:
                if model["state"] == "ready":
                    await asyncio.to_thread(_admin, server, f"/{model['name']}/unload", "POST")
            await asyncio.to_thread(_wait_for_warm_spare, server)
            timing = await stream_one(session, url, request_body(MODELS[0], round_index, max_tokens))
            if timing.error:
                raise RuntimeError(timing.error)
            ttfts.append(timing.ttft)
    return {
        "loads": len(ttfts),
        "load_to_first_token_p50_s": rounded(percentile(ttfts, 50)),
        "load_to_first_token_p99_s": rounded(percentile(ttfts, 99)),
        "load_to_first_token_min_s": rounded(min(ttfts)),
    }


async def run_multi_model(engine: Path, workdir: Path, rounds: int, max_tokens: int) -> dict:
    engines = workdir / "engines"
    engines.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        copy_engine(engine, engines, name)
    report = {"models": list(MODELS), "capacity_bytes": CAPACITY, "kv_cache_bytes": KV_BYTES}
    # The spare refill policy trades swap time against interference with the requests after a swap.
    for refill in ("when-idle", "after-load"):
        server = _start(engines, workdir / f"multi-model-{refill}.log", refill)
        try:
            variant = {}
            if refill == "when-idle":
                variant["cold_load_empty_device"] = await _cold_loads(server, rounds, max_tokens)
                variant["swaps_with_warm_spare"] = await _pairs(server, rounds, max_tokens, warm_spare=True)
            variant["swaps_back_to_back"] = await _pairs(server, rounds, max_tokens, warm_spare=False)
            variant["evictions"] = {m["name"]: m["evictions"] for m in _admin(server)["models"]}
        finally:
            server.stop()
        report[f"spare_refill_{refill}"] = variant
    return report


def _start(engines: Path, log: Path, refill: str) -> ServerProcess:
    return start_server(
        engines, log,
        "--worker.kv-cache-bytes", str(KV_BYTES),
        "--worker.spare-refill", refill,
        "--memory.capacity-bytes", str(CAPACITY),
        "--memory.reserve-bytes", "0",
        "--scheduling.preload", "pinned",
        "--scheduling.queue-timeout-s", "120",
    )
