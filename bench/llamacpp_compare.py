"""Inferno's llamacpp backend against llama.cpp's own llama-server: the same GGUF file, the same workload.

    python -m bench.llamacpp_compare --engine engines/smollm2-135m-gguf --llama-server .llama.cpp/build/bin/llama-server

The workload is `inferno bench`'s, sent to both servers the same way: 32 chat requests per level with seeded
64-token prompts (counted with the engine's tokenizer and chat template), 64 output tokens each (`ignore_eos`
forces all 64), greedy, streamed, at concurrency 1 and 16, after 2 warm-up requests. llama-server runs with 16
slots, as many KV cells as Inferno's engine gets, the same threads, and its default prompt cache. Each
server's processes are measured for CPU per token. The two `inferno bench` results and the ratios go to
bench/results/llamacpp-compare-*.json.
"""

from __future__ import annotations

import argparse
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

from orchestrator.backends.llamacpp import default_threads
from orchestrator.engine.manifest import load_manifest
from orchestrator.launch import start_server

SLOTS = 16
CELL_PADDING = 256


def measure(url: str, pid: int, engine: Path, args: argparse.Namespace, out: Path, label: str) -> dict:
    """One `inferno bench` run against `url` (its server's process `pid`); returns its JSON result."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "orchestrator", "bench", "--url", url, "--server-pid", str(pid),
               "--tokenizer", str(engine), "--endpoint", "chat", "--concurrency", args.levels,
               "--requests", str(args.requests), "--isl", str(args.isl), "--osl", str(args.max_tokens),
               "--warmup", "2", "--seed", "0", "--out", str(out), "--no-plot"]
    print(f"{label}:", flush=True)
    subprocess.run(command, check=True)
    [result] = sorted(out.glob("bench-*.json"))
    return json.loads(result.read_text())


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
                    return process, base
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
    parser.add_argument("--isl", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=default_threads(os.cpu_count() or 1),
                        help="llama.cpp threads on both sides (default: the backend's, one core left free)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    manifest = load_manifest(args.engine)
    cells = manifest.kv_cache.default_budget_bytes // manifest.kv_cache.bytes_per_token // CELL_PADDING * CELL_PADDING
    threads = args.threads
    report: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "engine": str(args.engine),
        "llama_server": {"slots": SLOTS, "ctx_cells": cells, "threads": threads},
    }
    with tempfile.TemporaryDirectory(prefix="inferno-llamacpp-bench-") as tmp:
        server = start_server(args.engine.parent, Path(tmp) / "inferno.log", "--models", args.engine.name,
                              "--worker.threads", str(threads))
        try:
            report["inferno"] = measure(server.base_url, server.pid, args.engine, args, Path(tmp) / "inferno",
                                        "inferno (llamacpp backend)")
        finally:
            server.stop()
        process, base = start_llama_server(args.llama_server, args.engine / "model.gguf", cells, threads,
                                           Path(tmp) / "llama-server.log")
        try:
            report["llama_server_results"] = measure(base, process.pid, args.engine, args,
                                                     Path(tmp) / "llama-server", "llama-server")
        finally:
            process.terminate()
            process.wait(timeout=30)
    report["ratios"] = [
        {"concurrency": i["load"]["concurrency"],
         "output_tok_s_inferno_over_llama_server": round(i["output_tok_s"] / s["output_tok_s"], 3),
         "ttft_p50_inferno_over_llama_server": round(i["ttft_s"]["p50"] / s["ttft_s"]["p50"], 3),
         "server_us_per_token": {"inferno": i["server_cpu"]["us_per_token"],
                                 "llama_server": s["server_cpu"]["us_per_token"]}}
        for i, s in zip(report["inferno"]["rows"], report["llama_server_results"]["rows"], strict=True)
    ]
    print(json.dumps(report["ratios"], indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"llamacpp-compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
