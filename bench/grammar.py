"""Grammar costs on a real vocabulary: compile time (cold and cached), the grammar checker's round trips, and
the per-row cost of filling and applying the token bitmask while decoding. Writes JSON.

    python -m bench.grammar [--engine engines/smollm2-135m-hf] [--threads 1] [--out bench/results]

Last, the engine's step with and without constraints (`--steps 1,8`): the engine in this process, greedy
requests with and without a regex guide, ms per step and their ratio.

Timings are taken with torch on one thread (the masking is small tensor work).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path
from typing import Literal

import psutil
import torch
import xgrammar as xgr
from pydantic import BaseModel
from tokenizers import Tokenizer

from orchestrator.bench.report import write
from orchestrator.bench.stats import percentile, rounded
from orchestrator.structured.checker import GrammarChecker
from orchestrator.structured.grammar.compile import compile_guide, new_compiler
from orchestrator.structured.grammar.matcher import GrammarCache, GuidedBatchMasker
from orchestrator.structured.guide import Guide, choice_guide, json_schema_guide
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tools import ToolDefinition, plan_tools
from orchestrator.structured.vocabulary import load_vocabulary


class Address(BaseModel):
    street: str
    city: str
    zip_code: str | None


class Person(BaseModel):
    name: str
    age: int
    role: Literal["admin", "user", "guest"]
    tags: list[str]
    address: Address
    scores: list[float]


def _tools() -> list[ToolDefinition]:
    schemas = {"lookup_person": Person, "get_address": Address}
    tools = [
        {"type": "function", "function": {"name": name, "parameters": model.model_json_schema()}}
        for name, model in schemas.items()
    ]
    return [
        ToolDefinition.model_validate(t) for t in [*tools, {"type": "function", "function": {"name": "ping"}}]
    ]


PERSON = Person(
    name="Ada Lovelace",
    age=36,
    role="admin",
    tags=["math", "engines"],
    address=Address(street="St James's Square", city="London", zip_code=None),
    scores=[9.5, 10.0],
)
HERMES = TOOL_FORMATS["hermes"]


def cases() -> dict[str, tuple[Guide, str]]:
    """Each benchmarked guide, with an output it accepts (decoded along to time the masks)."""
    tools_guide = tool_call_guide(plan_tools(_tools(), "required", None), HERMES)
    tools_output = HERMES.calls_text([("lookup_person", PERSON.model_dump()), ("ping", {})])
    return {
        "json_object": (Guide("json_object"), '{"answer": 42, "why": "because"}'),
        "small_schema": (
            json_schema_guide({"type": "object", "properties": {"answer": {"type": "integer"}}}, param="s"),
            '{"answer": 42}',
        ),
        "nested_schema": (json_schema_guide(Person.model_json_schema(), param="s"), PERSON.model_dump_json()),
        "regex": (Guide("regex", r"\d{3}-\d{3}-\d{4}"), "555-123-4567"),
        "choice": (choice_guide(["positive", "negative", "neutral"], "c"), "neutral"),
        "tools_hermes_required": (tools_guide, tools_output),
    }


def bench_compile(vocabulary, threads: int, repeats: int) -> dict:
    results = {}
    for name, (guide, _) in cases().items():
        kind, text = guide.compiled_form()
        cold, cached = [], []
        for _ in range(repeats):
            compiler = new_compiler(vocabulary, threads=threads)
            for samples in (cold, cached):
                started = time.perf_counter()
                compile_guide(compiler, kind, text)
                samples.append(time.perf_counter() - started)
        results[name] = {
            "cold_ms": rounded(statistics.median(cold) * 1000, 3),
            "cached_ms": rounded(statistics.median(cached) * 1000, 4),
        }
    return results


def bench_masks(folder: Path, vocabulary, rows_list: list[int]) -> dict:
    """Per-row microseconds of GuidedBatchMasker.apply (fill every constrained row's bitmask, then mask its
    logits), and of the fill alone, at each position of an accepted output, in batches whose rows are all
    constrained."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cache = GrammarCache(vocabulary)
    results = {}
    for name, (guide, output) in cases().items():
        tokens = tokenizer.encode(output, add_special_tokens=False).ids
        results[name] = {"tokens": len(tokens)}
        for rows in rows_list:
            states = [cache.new_state(guide) for _ in range(rows)]
            masker = GuidedBatchMasker(vocabulary.size, rows=rows)
            base = torch.randn(rows, vocabulary.size)
            logits = torch.empty_like(base)
            per_row, fill_per_row = [], []
            bitmask = xgr.allocate_token_bitmask(rows, vocabulary.size)
            for token in tokens:
                started = time.perf_counter()
                for row, state in enumerate(states):
                    state.fill(bitmask, row)
                fill_per_row.append((time.perf_counter() - started) / rows * 1e6)
                logits.copy_(base)
                started = time.perf_counter()
                masker.apply(logits, list(enumerate(states)))
                per_row.append((time.perf_counter() - started) / rows * 1e6)
                if not all(state.accept(token) for state in states):
                    raise RuntimeError(f"{name}: the grammar refused its own example at token {token}")
            results[name][f"rows_{rows}"] = {
                "fill_only_per_row_us_p50": rounded(percentile(fill_per_row, 50), 2),
                "per_row_us_p50": rounded(percentile(per_row, 50), 2),
                "per_row_us_p90": rounded(percentile(per_row, 90), 2),
                "per_row_us_max": rounded(max(per_row), 2),
            }
    return results


async def bench_steps(folder: Path, batches: list[int], tokens: int, threads: int, rounds: int = 5) -> dict:
    """The engine step with and without constraints: the engine in this process (the hf backend for an hf
    engine), `batch` greedy requests at a time, `tokens` output tokens each (end tokens biased by -100, so no
    request ends early). Constrained requests follow the regex `[a-z ]+` (a bounded repetition such as
    `[a-z ]{64}` is far dearer to fill in xgrammar: ~21 ms a row on this vocabulary, against 0.2 ms). Reports
    ms per engine step (first token to last, per request; the median over `rounds` turns) for both, and
    their ratio."""
    from bench.inprocess import open_engine, run_request
    from orchestrator.engine.manifest import load_manifest
    from orchestrator.engine.request import EngineRequest, SamplingParams

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = tuple(tokenizer.encode("Write a long story about the sea and the wind.").ids)
    guide = Guide("regex", "[a-z ]+")
    manifest = load_manifest(folder)
    no_end = tuple((token, -100.0) for token in manifest.tokenizer.eos_token_ids)
    results: dict = {}
    async with open_engine(folder, threads=threads) as engine:
        for batch in batches:
            runs: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
            for turn in range(rounds):  # taking turns: an engine step's time drifts by more than masking costs
                for label, found in runs.items():
                    steps: list[float] = []

                    async def one(number: int, label=label, steps=steps, batch=batch, turn=turn) -> None:
                        stamps: list[float] = []
                        request = EngineRequest(
                            f"{label}-{batch}-{turn}-{number}", prompt, max_new_tokens=tokens,
                            sampling=SamplingParams(temperature=0.0, logit_bias=no_end),
                            guide=guide if label == "constrained" else None)
                        error = await run_request(engine, request, lambda n, at: stamps.append(at))
                        if error is not None:
                            raise RuntimeError(error)
                        steps.append((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3)

                    await asyncio.gather(*(one(i) for i in range(batch)))
                    found.append(statistics.median(steps))
            plain, guided = statistics.median(runs["unconstrained"]), statistics.median(runs["constrained"])
            results[f"batch_{batch}"] = {
                "unconstrained_step_ms": rounded(plain, 2), "constrained_step_ms": rounded(guided, 2),
                "constrained_over_unconstrained": rounded(guided / plain, 3),
                "rounds_ms": {label: [rounded(v, 2) for v in values] for label, values in runs.items()},
            }
    return {"engine_threads": threads, "tokens": tokens, **results}


async def bench_checker(folder: Path) -> dict:
    checker = GrammarChecker()
    guides = [guide for guide, _ in cases().values()]
    try:
        started = time.perf_counter()
        await checker.start()
        start_s = time.perf_counter() - started
        rss = psutil.Process(checker._process.pid).memory_info().rss
        timings = []
        for guide in [*guides, guides[-1]]:  # the last one again: answered from the cache
            started = time.perf_counter()
            await checker.check(folder, guide)
            timings.append(time.perf_counter() - started)
        return {
            "process_start_s": rounded(start_s, 3),
            "process_rss_mib_after_start": rounded(rss / 2**20, 1),
            "first_check_with_vocabulary_load_s": rounded(timings[0], 3),
            "new_guide_check_ms_p50": rounded(statistics.median(timings[1:-1]) * 1000, 3),
            "cached_check_us": rounded(timings[-1] * 1e6, 1),
            "round_trips": checker.round_trips,
        }
    finally:
        await checker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path("engines/smollm2-135m-hf"))
    parser.add_argument("--threads", type=int, default=1, help="xgrammar compile threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default="1,8,32", help="batch sizes of constrained rows")
    parser.add_argument("--steps", default="1,8", help="batch sizes for the engine-step comparison ('' skips it)")
    parser.add_argument("--step-tokens", type=int, default=32)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    vocabulary = load_vocabulary(args.engine)
    load_s = time.perf_counter() - started
    report = {
        "host": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_start": rounded(os.getloadavg()[0], 2),
            "machine": platform.machine(),
            "torch_threads": torch.get_num_threads(),
        },
        "versions": {"xgrammar": version("xgrammar"), "torch": version("torch")},
        "engine": args.engine.name,
        "vocabulary": {"size": vocabulary.size, "load_s": rounded(load_s, 3)},
        "compile_threads": args.threads,
        "compile": bench_compile(vocabulary, args.threads, args.repeats),
        "mask": bench_masks(args.engine, vocabulary, [int(r) for r in args.rows.split(",")]),
        "checker": asyncio.run(bench_checker(args.engine)),
    }
    if args.steps:
        batches = [int(b) for b in args.steps.split(",")]
        report["steps"] = asyncio.run(bench_steps(args.engine, batches, args.step_tokens, args.engine_threads))
    print(json.dumps(report, indent=2))
    print(f"wrote {write(report, args.out, prefix='grammar')}")


if __name__ == "__main__":
    main()
