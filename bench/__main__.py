"""`make bench`: serving throughput and latency at several concurrencies, the same load driven straight into
the backend for comparison, and the multi-model swap scenario. Writes JSON to bench/results/.

    python -m bench [--levels 1,4,16] [--requests 48] [--max-tokens 64] [--rounds 6] [--skip-direct]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from bench.direct import run_direct
from bench.loadgen import Timing, run_load
from bench.multi_model import run_multi_model
from bench.stats import cpu_seconds, percentile, rounded
from orchestrator.launch import start_server


def summarise(concurrency: int, timings: list[Timing], wall_s: float) -> dict:
    errors = [t.error for t in timings if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    tokens = sum(t.completion_tokens for t in timings)
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    gaps = [gap for t in timings for gap in t.gaps]
    return {
        "concurrency": concurrency,
        "requests": len(timings),
        "output_tokens": tokens,
        "wall_s": rounded(wall_s, 3),
        "output_tok_s": rounded(tokens / wall_s, 2),
        "req_s": rounded(len(timings) / wall_s, 3),
        "ttft_p50_s": rounded(percentile(ttfts, 50)),
        "ttft_p99_s": rounded(percentile(ttfts, 99)),
        "itl_p50_s": rounded(percentile(gaps, 50)),
        "itl_p99_s": rounded(percentile(gaps, 99)),
    }


async def bench_http(engine: Path, workdir: Path, levels: list[tuple[int, int]], max_tokens: int) -> list[dict]:
    server = start_server(engine.parent, workdir / "server.log", "--models", engine.name)
    results = []
    try:
        await run_load(server.api, engine.name, 1, 2, max_tokens)  # one warm-up pass through the whole path
        for concurrency, requests in levels:
            cpu_total, cpu_http = cpu_seconds(server.pid), cpu_seconds(server.pid, children=False)
            timings, wall = await run_load(server.api, engine.name, concurrency, requests, max_tokens)
            row = summarise(concurrency, timings, wall)
            per_1k = 1000 / max(1, row["output_tokens"])
            row["cpu_s_per_1k_tokens_total"] = rounded((cpu_seconds(server.pid) - cpu_total) * per_1k, 3)
            row["cpu_s_per_1k_tokens_http_process"] = rounded(
                (cpu_seconds(server.pid, children=False) - cpu_http) * per_1k, 3
            )
            results.append(row)
            print(f"  http   c={concurrency:<3} {row['output_tok_s']:>8} tok/s  ttft p50 {row['ttft_p50_s']} s", flush=True)
    finally:
        server.stop()
    return results


def ratios(http: list[dict], direct: list[dict]) -> list[dict]:
    return [
        {
            "concurrency": h["concurrency"],
            "throughput_http_over_direct": rounded(h["output_tok_s"] / d["output_tok_s"], 3),
            "ttft_p50_http_over_direct": rounded(h["ttft_p50_s"] / d["ttft_p50_s"], 3),
        }
        for h, d in zip(http, direct, strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path("engines/smollm2-135m"))
    parser.add_argument("--levels", default="1,4,16", help="concurrency levels")
    parser.add_argument("--requests", type=int, default=48, help="requests per level (at least 4 x concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6, help="model switches per multi-model variant")
    parser.add_argument("--skip-direct", action="store_true")
    parser.add_argument("--skip-multi-model", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.levels.split(",")]
    levels = [(c, max(args.requests, 4 * c) if c > 1 else max(8, args.requests // 4)) for c in concurrencies]

    report: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": version("torch"),
            "transformers": version("transformers"),
        },
        "engine": str(args.engine),
        "max_tokens": args.max_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="inferno-bench-") as tmp:
        workdir = Path(tmp)
        print("serving path (HTTP + IPC + worker):", flush=True)
        report["http"] = asyncio.run(bench_http(args.engine, workdir, levels, args.max_tokens))
        if not args.skip_direct:
            print("the hf backend driven directly, in-process:", flush=True)
            direct = [summarise(c, t, w) for c, t, w in asyncio.run(run_direct(args.engine, levels, args.max_tokens))]
            for row in direct:
                print(f"  direct c={row['concurrency']:<3} {row['output_tok_s']:>8} tok/s  ttft p50 {row['ttft_p50_s']} s")
            report["direct"] = direct
            report["ratios"] = ratios(report["http"], direct)
        if not args.skip_multi_model:
            print("multi-model swaps:", flush=True)
            report["multi_model"] = asyncio.run(run_multi_model(args.engine, workdir, args.rounds, 16))
            print(f"  {json.dumps(report['multi_model'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
