"""`python -m bench.sim`: the sim backend alone, in-process through RequestStreams, at its simulated GPU's
rates. Closed-loop clients each send an ISL-token prompt asking for exactly OSL tokens, and the next one as
soon as it ends. Reports the output rate against what the engine model predicts for the same load in
simulated time (the same engine stepped without sleeping), and the CPU the `sim-engine` thread spends per
simulated step, which a benchmark of the whole server subtracts to see the orchestrator's own cost.

    python -m bench.sim --engine engines/llama3.1-8b-instruct-sim [--concurrency 128] [--isl 128] [--osl 128]
                        [--requests 1024] [--speedup 1]

The engine must batch at least `concurrency` requests (build it with --sim-param max_batch_size=256).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from tokenizers import Tokenizer

from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.backends.sim.backend import THREAD_NAME, SimBackend
from orchestrator.backends.sim.corpus import corpus_tokens
from orchestrator.backends.sim.engine import SimEngine
from orchestrator.backends.sim.spec import SimSpec, load_sim_spec
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.stats import percentile, rounded
from orchestrator.engine.manifest import EngineManifest, load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(name: str) -> float:
    """User + system CPU of this process's threads with that OS-level name, from /proc."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == name:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            continue
    return total / TICKS


def prompts(tokenizer: Tokenizer, eos: frozenset[int], isl: int, count: int) -> list[tuple[int, ...]]:
    """Prompts of `isl` real tokens that differ from their first block on, so none is a prefix-cache hit."""
    corpus = corpus_tokens(tokenizer, eos)
    looped = corpus * (isl // len(corpus) + 2)
    return [(corpus[index % len(corpus)], *looped[index % 97 : index % 97 + isl - 1]) for index in range(count)]


def predicted(spec: SimSpec, manifest: EngineManifest, blocks: int, requests: list[EngineRequest],
              concurrency: int) -> tuple[float, float, int]:
    """The same closed loop stepped in simulated time: (simulated seconds for all of it, output tokens per
    simulated second once every client has had one answer, steps)."""
    engine = SimEngine(spec.step, manifest.limits, manifest.kv_cache.tokens_per_block, blocks, (1, 2, 3), 100)
    pending = iter(requests)
    for _ in range(concurrency):
        engine.add(next(pending))
    elapsed = produced = done = steps = 0
    warm = None
    while engine.busy:
        result = engine.step()
        steps += result.scheduled
        elapsed += result.step_ms
        for delta in result.deltas:
            produced += len(delta.token_ids)
            if delta.finish is not None:
                done += 1
                request = next(pending, None)
                if request is not None:
                    engine.add(request)
        if warm is None and done >= concurrency:
            warm = (elapsed, produced)
    return elapsed / 1e3, (produced - warm[1]) / (elapsed - warm[0]) * 1e3, steps


async def drive(streams: RequestStreams, requests: list[EngineRequest], concurrency: int) -> tuple[list[RequestTiming], float]:
    pending = iter(requests)
    timings: list[RequestTiming] = []

    async def client() -> None:
        for request in pending:
            timing = RequestTiming("sim", time.perf_counter(), output_tokens=0)
            async for delta in streams.stream(request):
                if delta.token_ids:
                    timing.token_times.append(time.perf_counter())
                    timing.output_tokens += len(delta.token_ids)
            timings.append(timing)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return timings, time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict:
    manifest, spec = load_manifest(args.engine), load_sim_spec(args.engine)
    if manifest.backend != "sim" or manifest.limits.max_batch_size < args.concurrency:
        raise SystemExit(f"{args.engine}: a sim engine batching at least {args.concurrency} requests is needed "
                         f"(inferno build llama3.1-8b-sim --sim-param max_batch_size=256)")
    if args.speedup is not None:
        manifest = manifest.model_copy(update={"simulation": manifest.simulation.model_copy(update={"speedup": args.speedup})})
    tokenizer = Tokenizer.from_file(str(args.engine / "tokenizer.json"))
    texts = prompts(tokenizer, frozenset(manifest.tokenizer.eos_token_ids), args.isl, args.requests)
    requests = [
        EngineRequest(f"b{i}", prompt, args.osl, SamplingParams(seed=i), ignore_eos=True) for i, prompt in enumerate(texts)
    ]
    backend = SimBackend(BackendSettings(args.engine, manifest, manifest.kv_cache.default_budget_bytes), spec)
    streams = RequestStreams(backend)
    await backend.start(streams)
    kv_blocks = backend.stats().kv_blocks_total
    try:
        cpu, steps, process_cpu = thread_cpu_s(THREAD_NAME), backend.stats().iterations, time.process_time()
        timings, wall = await drive(streams, requests, args.concurrency)
        thread_cpu = thread_cpu_s(THREAD_NAME) - cpu
        steps = backend.stats().iterations - steps
        process_cpu = time.process_time() - process_cpu
    finally:
        await backend.close()
    speedup = manifest.simulation.speedup
    simulated_s, steady_tok_s, simulated_steps = predicted(spec, manifest, kv_blocks, requests, args.concurrency)
    tokens = sum(t.tokens for t in timings)
    gaps = [gap for t in timings for gap in t.gaps]
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    return {
        "engine": str(args.engine), "gpu": manifest.simulation.gpu, "precision": manifest.simulation.precision,
        "speedup": speedup, "isl": args.isl, "osl": args.osl, "concurrency": args.concurrency,
        "requests": len(timings), "output_tokens": tokens, "wall_s": rounded(wall, 3),
        "output_tok_s": rounded(tokens / wall, 1),
        "predicted_wall_s": rounded(simulated_s / speedup, 3), "predicted_steps": simulated_steps,
        "predicted_output_tok_s": rounded(tokens / simulated_s * speedup, 1),
        "predicted_steady_output_tok_s": rounded(steady_tok_s * speedup, 1),
        "measured_over_predicted": rounded(simulated_s / speedup / wall, 4),
        "req_s": rounded(len(timings) / wall, 2),
        "ttft_p50_ms": rounded(percentile(ttfts, 50) * 1e3, 2), "ttft_p99_ms": rounded(percentile(ttfts, 99) * 1e3, 2),
        "itl_p50_ms": rounded(percentile(gaps, 50) * 1e3, 3), "itl_p99_ms": rounded(percentile(gaps, 99) * 1e3, 3),
        "steps": steps, "mean_step_wall_ms": rounded(wall / steps * 1e3, 3),
        "sim_thread_cpu_s": rounded(thread_cpu, 3), "sim_thread_cpu_us_per_step": rounded(thread_cpu / steps * 1e6, 1),
        "sim_thread_core_share": rounded(thread_cpu / wall, 4),
        "process_cpu_s": rounded(process_cpu, 3),
        "process_cpu_us_per_token": rounded(process_cpu / tokens * 1e6, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--isl", type=int, default=128, help="prompt tokens")
    parser.add_argument("--osl", type=int, default=128, help="generated tokens (ignore_eos)")
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--speedup", type=float, help="override the engine's speed-up")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    result = {"started_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
              **result}
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sim-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
