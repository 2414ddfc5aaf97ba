"""Inferno's llamacpp backend against llama.cpp's own llama-server: the same GGUF file, the same workload.

    python -m bench.llamacpp_compare --engine engines/smollm2-135m-gguf --llama-server .llama.cpp/build/bin/llama-server

The workload: 32 chat prompts (bench/prompts.py), 64 output tokens each (ignore_eos forces all 64), greedy,
streamed, at concurrency 1 and 16. llama-server runs with 16 slots, as many KV cells as Inferno's engine gets,
the same threads, and its default prompt cache. Both are measured through their OpenAI endpoints with the same
client; the results go to bench/results/llamacpp-compare-*.json. (Small on purpose: `inferno bench` can
replace it.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.__main__ import summarise
from bench.loadgen import Timing, stream_one
from bench.prompts import messages
from orchestrator.backends.llamacpp import default_threads
from orchestrator.engine.manifest import load_manifest
from orchestrator.launch import start_server

SLOTS = 16
CELL_PADDING = 256


def body(model: str, index: int, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": messages(index),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def run_level(api: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    indices = iter(range(requests))
    timings: list[Timing] = []
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)  # llama-server closes after a stream
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def client() -> None:
            for index in indices:
                timing = await stream_one(session, f"{api}/chat/completions", body(model, index, max_tokens))
                if not timing.completion_tokens:  # no usage chunk: one streamed chunk per token
                    timing.completion_tokens = len(timing.chunk_times)
                timings.append(timing)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return summarise(concurrency, timings, wall)


async def measure(api: str, model: str, levels: list[int], requests: int, max_tokens: int, label: str) -> list[dict]:
    await run_level(api, model, 1, 2, max_tokens)  # warm-up
    rows = []
    for concurrency in levels:
        row = await run_level(api, model, concurrency, requests, max_tokens)
        rows.append(row)
        print(f"  {label:<12} c={concurrency:<3} {row['output_tok_s']:>8} tok/s  ttft p50 {row['ttft_p50_s']} s  "
              f"itl p50 {row['itl_p50_s']} p99 {row['itl_p99_s']}", flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_llama_server(binary: Path, gguf: Path, cells: int, threads: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(SLOTS),
               "-c", str(cells), "-t", str(threads), "-tb", str(threads)]
    process = subprocess.Popen(command, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited with {process.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return process, f"{base}/v1"
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"llama-server did not become healthy; see {log_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llamacpp_compare", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path("engines/smollm2-135m-gguf"))
    parser.add_argument("--llama-server", type=Path, default=Path(".llama.cpp/build/bin/llama-server"))
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=default_threads(os.cpu_count() or 1),
                        help="llama.cpp threads on both sides (default: the backend's, one core left free)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.levels.split(",")]
    manifest = load_manifest(args.engine)
    cells = manifest.kv_cache.default_budget_bytes // manifest.kv_cache.bytes_per_token // CELL_PADDING * CELL_PADDING
    threads = args.threads
    report: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "engine": str(args.engine),
        "workload": {"prompts": args.requests, "max_tokens": args.max_tokens, "ignore_eos": True, "greedy": True,
                     "stream": True, "levels": levels},
        "llama_server": {"slots": SLOTS, "ctx_cells": cells, "threads": threads},
    }
    with tempfile.TemporaryDirectory(prefix="inferno-llamacpp-bench-") as tmp:
        print("inferno (llamacpp backend):", flush=True)
        server = start_server(args.engine.parent, Path(tmp) / "inferno.log", "--models", args.engine.name,
                              "--worker.threads", str(threads))
        try:
            report["inferno"] = asyncio.run(measure(server.api, args.engine.name, levels, args.requests,
                                                    args.max_tokens, "inferno"))
        finally:
            server.stop()
        print("llama-server:", flush=True)
        process, api = start_llama_server(args.llama_server, args.engine / "model.gguf", cells, threads,
                                          Path(tmp) / "llama-server.log")
        try:
            report["llama_server_results"] = asyncio.run(measure(api, "model", levels, args.requests,
                                                                 args.max_tokens, "llama-server"))
        finally:
            process.terminate()
            process.wait(timeout=30)
    report["ratios"] = [
        {"concurrency": i["concurrency"],
         "output_tok_s_inferno_over_llama_server": round(i["output_tok_s"] / s["output_tok_s"], 3),
         "ttft_p50_inferno_over_llama_server": round(i["ttft_p50_s"] / s["ttft_p50_s"], 3)}
        for i, s in zip(report["inferno"], report["llama_server_results"], strict=True)
    ]
    print(json.dumps(report["ratios"], indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"llamacpp-compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
