"""`inferno bench`: parse, run, write the result file and the plot, print the table.

    inferno bench --engines-dir engines --concurrency 1,4,16
    inferno bench --url http://127.0.0.1:8000 --rate 5,10 --duration 60 --slo ttft=0.5,itl=0.05
    inferno bench --engines-dir engines --scenario two-keys --concurrency 32 --osl 512
    inferno bench --scenario agent-turns --engines-dir engines --model llama3.1-8b-instruct-sim   (agent_turns.py)
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from orchestrator import aio
from orchestrator.bench.options import BenchError, BenchOptions, parse_options, scenario_of
from orchestrator.bench.plot import plot
from orchestrator.bench.report import table, write
from orchestrator.bench.run import Baseline, open_target, run_bench
from orchestrator.bench.targets import Target, TargetError
from orchestrator.bench.two_keys import run_two_keys, summary_lines


async def stoppable(work: Coroutine):
    """Run `work` so that SIGTERM cancels it like Ctrl-C does: its `finally` blocks stop the servers it started."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _show(row: dict) -> None:
    (key, value), = row["load"].items()
    load = {"concurrency": f"c={value}", "rate": f"{value:g}/s"}.get(key, "trace")
    ttft, itl = row["ttft_s"]["p50"], row["itl_s"]["p50"]
    server = row.get("server_cpu") or {}
    cpu = ""
    if "floor_ratio" in server:
        counted = server.get("us_per_token_excluding", server["us_per_token"])
        cpu = f"  server {counted:.1f} us/tok = {server['floor_ratio']:.2f}x floor"
    print(
        f"  {row['series']:<10} {load:<8} {row['output_tok_s'] or 0:>9.1f} tok/s  "
        f"ttft p50 {'-' if ttft is None else f'{ttft * 1000:.1f} ms'}  "
        f"itl p50 {'-' if itl is None else f'{itl * 1000:.2f} ms'}  errors {row['errors']}{cpu}", flush=True)


def _print_summary(report: dict, path: Path) -> None:
    print()
    print(table(report["rows"]))
    print("(ttft, itl in ms; e2e in s; client us/chunk: the load generator's CPU per SSE event; "
          "server us/tok: server CPU per output token; x floor: that (excluding --exclude-threads) over the floor)")
    floor = report.get("floor")
    if floor:
        print(f"floor: {floor['us_per_write']} us of CPU per SSE-sized loopback write ({floor['user_us_per_write']} user + "
              f"{floor['system_us_per_write']} system; {floor['writes']} writes in bursts of {floor['sockets']}), "
              "measured before the run")
    for ratio in report["ratios"]:
        (key, value), = ratio["load"].items()
        print(f"{report['rows'][0]['series']} / {ratio['of']} at {key} {value}: throughput {ratio['output_tok_s']}x, "
              f"ttft p50 {ratio['ttft_p50']}x, itl p50 {ratio['itl_p50']}x")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"wrote {path}")


def bench_command(argv: list[str]) -> int:
    try:
        if scenario_of(argv) == "agent-turns":
            from orchestrator.bench.agent_turns import agent_turns_command

            return agent_turns_command(argv)
        options = parse_options(argv)
    except BenchError as exc:
        print(f"inferno bench: error: {exc}", file=sys.stderr)
        return 2
    if options.scenario == "two-keys":
        return two_keys_command("inferno bench", argv, options)
    return run_command("inferno bench", argv, options)


def _report(prog: str, run: Callable[[Path], Coroutine[Any, Any, dict]]) -> dict | int:
    """Run one benchmark (`run(workdir)`, a scratch folder that is gone after) to its report; or, when it could
    not run or was stopped, the exit status, with why printed."""
    try:
        with tempfile.TemporaryDirectory(prefix="inferno-bench-") as workdir:
            return aio.run(stoppable(run(Path(workdir))))
    except (BenchError, TargetError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"{prog}: stopped; no result written", file=sys.stderr)
        return 130


def two_keys_command(prog: str, argv: list[str], options: BenchOptions) -> int:
    """The two-keys scenario: run it, write its result file, print its summary. Exit status 1 when any request
    failed other than by a 429 (the 429s are what it measures)."""
    report = _report(prog, lambda workdir: run_two_keys(options, [*prog.split(), *argv], workdir))
    if isinstance(report, int):
        return report
    path = write(report, options.out, prefix="two-keys")
    for line in summary_lines(report):
        print(line)
    print(f"wrote {path}")
    return 1 if report["errors"] else 0


def run_command(
    prog: str, argv: list[str], options: BenchOptions,
    target_of: Callable[[BenchOptions, Path], Target] = open_target, baselines: Sequence[Baseline] = (),
) -> int:
    """Run every series, write the result file and the plot, print the table; returns the exit status.
    `inferno bench` runs through here, and so do the dev comparisons that add baselines (bench/baselines.py)."""
    report = _report(prog, lambda workdir: run_bench(options, [*prog.split(), *argv], workdir, _show, target_of,
                                                     baselines))
    if isinstance(report, int):
        return report
    path = write(report, options.out)
    if options.plot:
        png = path.with_suffix(".png")
        note = plot(report["rows"], png)
        report["plot"] = str(png) if note is None else None
        if note:
            report["notes"].append(note)
        path.write_text(json.dumps(report, indent=2))
    _print_summary(report, path)
    return 1 if report["errors"] else 0
