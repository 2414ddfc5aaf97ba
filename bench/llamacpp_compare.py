"""Inferno's llamacpp backend against llama.cpp's own llama-server: the same GGUF file, the same workload.

    python -m bench.llamacpp_compare --engine engines/smollm2-135m --llama-server .llama.cpp/build-noamx/bin/llama-server

The workload is `inferno bench`'s, sent to both servers the same way: 32 chat requests per level with seeded
64-token prompts (counted with the engine's tokenizer and chat template), 64 output tokens each (`ignore_eos`
forces all 64), greedy, streamed, at concurrency 1 and 16, after 2 warm-up requests. llama-server runs with the
engine's slots (`max_batch_size`), the KV cells Inferno's engine takes in the same layout (a stream per slot, or
`--kv-unified` when Inferno's budget makes one pool), and its default prompt cache; threads are each side's
own default (llama-server's: its `-t` default; Inferno's: sized per step) unless `--threads N` gives both N. Each
server's processes are measured for CPU per token. This machine's speed drifts by more than the difference
being measured (the same decode loop ran 15 ms/token on one core and 19 on the other), so both servers stay
up and are measured in turns, level by level, `--rounds` times each, the one going first alternating, with new
prompts each round and level (the same for both servers; seeded by both, so no prompt cache serves one from an
earlier run);
the ratios are per round, and summarised as their median, lowest and highest. Every result and ratio goes to
bench/results/llamacpp-compare-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.backends.llamacpp.backend import CELL_PADDING, kv_layout
from orchestrator.bench.report import write
from orchestrator.engine.manifest import load_manifest
from orchestrator.launch import start_server


def measure(url: str, pid: int, engine: Path, args: argparse.Namespace, out: Path, level: int, label: str,
            seed: int) -> dict:
    """One `inferno bench` run at concurrency `level` against `url` (its server's process `pid`) with the
    prompts of `seed`; returns its JSON result."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "orchestrator", "bench", "--url", url, "--server-pid", str(pid),
               "--tokenizer", str(engine), "--endpoint", "chat", "--concurrency", str(level),
               "--requests", str(args.requests), "--isl", str(args.isl), "--osl", str(args.max_tokens),
               "--warmup", "2", "--seed", str(seed), "--out", str(out), "--no-plot"]
    print(f"{label}:", flush=True)
    subprocess.run(command, check=True)
    [result] = sorted(out.glob("bench-*.json"))
    return json.loads(result.read_text())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_llama_server(binary: Path, gguf: Path, layout, threads: int | None,
                       log_path: Path) -> tuple[subprocess.Popen, str]:
    """llama-server on a free port; `threads` None: its own default."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(layout.slots),
               "-c", str(layout.cells), "--kv-unified" if layout.unified else "--no-kv-unified"]
    command += ["-t", str(threads), "-tb", str(threads)] if threads else []
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


def ratio_rows(inferno: dict, llama_server: dict) -> list[dict]:
    """Per concurrency level: Inferno's output tok/s and TTFT p50 over llama-server's, and both CPU costs."""
    return [
        {"concurrency": i["load"]["concurrency"],
         "output_tok_s_inferno_over_llama_server": round(i["output_tok_s"] / s["output_tok_s"], 3),
         "ttft_p50_inferno_over_llama_server": round(i["ttft_s"]["p50"] / s["ttft_s"]["p50"], 3),
         "server_us_per_token": {"inferno": i["server_cpu"]["us_per_token"],
                                 "llama_server": s["server_cpu"]["us_per_token"]}}
        for i, s in zip(inferno["rows"], llama_server["rows"], strict=True)
    ]


def summarise(rounds: list[list[dict]]) -> list[dict]:
    """Each level's ratios over the rounds: the median, and the lowest and highest round."""
    summary = []
    for level in zip(*rounds, strict=True):
        row = {"concurrency": level[0]["concurrency"], "rounds": len(level)}
        for key in ("output_tok_s_inferno_over_llama_server", "ttft_p50_inferno_over_llama_server"):
            values = sorted(r[key] for r in level)
            row[key] = {"median": round(statistics.median(values), 3), "min": values[0], "max": values[-1]}
        summary.append(row)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llamacpp_compare", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path("engines/smollm2-135m"))
    parser.add_argument("--llama-server", type=Path, default=Path(".llama.cpp/build-noamx/bin/llama-server"))
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--isl", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each server, taking turns (the one that goes first alternates)")
    parser.add_argument("--threads", type=int,
                        help="llama.cpp threads on both sides (default: each side's own default)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    manifest = load_manifest(args.engine)
    cells = manifest.kv_cache.default_budget_bytes // manifest.kv_cache.bytes_per_token // CELL_PADDING * CELL_PADDING
    layout = kv_layout(cells, manifest.limits.max_batch_size, manifest.limits.max_seq_len)
    threads = args.threads
    report: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "engine": str(args.engine),
        "llama_server": {"slots": layout.slots, "ctx_cells": layout.cells, "kv_unified": layout.unified,
                         "threads": threads or "its default"},
        "inferno": {"threads": threads or "its default (sized per step)"},
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="inferno-llamacpp-bench-") as tmp:
        server = start_server(args.engine.parent, Path(tmp) / "inferno.log", "--models", args.engine.name,
                              *(["--worker.threads", str(threads)] if threads else []))
        process = None
        try:
            process, base = start_llama_server(args.llama_server, args.engine / "model.gguf", layout, threads,
                                               Path(tmp) / "llama-server.log")
            targets = {"inferno": (server.base_url, server.pid, "inferno (llamacpp backend)"),
                       "llama_server": (base, process.pid, "llama-server")}
            levels = [int(level) for level in args.levels.split(",")]
            for number in range(args.rounds):
                # Both servers stay up, idle while the other is measured; the machine's speed drifts over
                # minutes, so they take turns level by level (a minute or two apart, not the length of a
                # whole run) and the one that goes first alternates. Each round and level has prompts of its
                # own (seeded by both): neither server's prompt cache holds earlier ones.
                order = ["inferno", "llama_server"] if number % 2 == 0 else ["llama_server", "inferno"]
                turns, ratios = [], []
                for index, level in enumerate(levels):
                    results = {}
                    for name in order:
                        url, pid, label = targets[name]
                        out = Path(tmp) / f"round-{number}" / f"c{level}" / name
                        results[name] = measure(url, pid, args.engine, args, out, level,
                                                f"round {number + 1}/{args.rounds}: {label}",
                                                seed=number + 1000 * index)
                    ratios += ratio_rows(results["inferno"], results["llama_server"])
                    turns.append({"concurrency": level, **results})
                print(json.dumps(ratios, indent=2), flush=True)
                report["rounds"].append({"order": order, "levels": turns, "ratios": ratios})
        finally:
            server.stop()
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
    report["ratios"] = summarise([r["ratios"] for r in report["rounds"]])
    print("over all rounds:")
    print(json.dumps(report["ratios"], indent=2))
    print(f"wrote {write(report, args.out, prefix='llamacpp-compare')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
