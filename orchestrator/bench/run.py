"""One `inferno bench` run: the target's series, then the same levels in-process and against the bare SSE
server where asked, and the ratios between them. Returns the whole result as one dict."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.bench.inprocess import open_engine
from orchestrator.bench.levels import WARMUP_SEED_OFFSET, plan_levels, warmup_specs
from orchestrator.bench.options import BenchError, BenchOptions
from orchestrator.bench.prompts import PromptMaker, prompts_for
from orchestrator.bench.report import machine, ratios, versions
from orchestrator.bench.senders import HttpSender, InProcessSender, RequestShape
from orchestrator.bench.series import CpuProbe, run_levels, warm_up
from orchestrator.bench.targets import Target, connect, start_bare_sse, start_inferno
from orchestrator.bench.workload import ModelMix, RequestSpec


def open_target(options: BenchOptions, workdir: Path) -> Target:
    names = list(options.models.names) if options.models else []
    if options.url:
        return connect(options.url, names, options.api_key, options.server_pid, options.tokenizer)
    if options.engines_dir:
        threads = ["--worker.threads", str(options.engine_threads)] if options.engine_threads else []
        return start_inferno(options.engines_dir, names, [*threads, *options.server_args], workdir / "server.log")
    return start_bare_sse(options.sse_step_ms, options.sse_burst, workdir / "bare-sse.log")


class Workload:
    """The levels, their prompts and the warm-up, made once for every series."""

    def __init__(self, options: BenchOptions, target: Target, notes: list[str]):
        """Raises BenchError for a trace that cannot be read or a length no prompt can have."""
        mix = options.models or ModelMix((target.models[0],))
        try:
            self.levels, level_notes = plan_levels(options, mix)
            self.models = sorted({s.model for level in self.levels for s in level.specs})
            self.makers = {m: PromptMaker(target.tokenizer_dirs.get(m, options.tokenizer), options.chat) for m in self.models}
            # Level i's prompts come from seed + 1000 * i, as its request plan does (levels.py): runs with nearby
            # seeds share no prompts, so no server's prompt cache serves one run from another's.
            self.prompts = [prompts_for(lv.specs, self.makers, options.seed + 1000 * i)
                            for i, lv in enumerate(self.levels)]
            self.warmup: list[RequestSpec] = warmup_specs(options, self.models)
            self.warmup_prompts = prompts_for(self.warmup, self.makers, options.seed + WARMUP_SEED_OFFSET)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
        notes += level_notes

    def describe(self) -> dict:
        exact = all(maker.exact for maker in self.makers.values())
        return {"isl_exact": exact, "method": {m: maker.method for m, maker in self.makers.items()}}


async def _http_series(
    name: str, target: Target, work: Workload, options: BenchOptions, show: Callable[[dict], None]
) -> list[dict]:
    shape = RequestShape(options.chat, options.ignore_eos, options.temperature)
    sender = HttpSender(target.api, shape, options.timeout_s, options.api_key)
    cpu = CpuProbe(target.pid, target.roles, options.exclude_threads) if target.pid else None
    try:
        await warm_up(sender, work.warmup, work.warmup_prompts)
        return await run_levels(name, sender, work.levels, work.prompts, options, cpu, show)
    finally:
        sender.close()


async def _in_process_series(work: Workload, options: BenchOptions, show: Callable[[dict], None]) -> list[dict]:
    from orchestrator.text.prompt import PromptEncoder

    shape = RequestShape(options.chat, options.ignore_eos, options.temperature)
    async with AsyncExitStack() as stack:
        engines = {m: await stack.enter_async_context(open_engine(options.engines_dir / m, options.engine_threads)) for m in work.models}
        encoders = {m: PromptEncoder(options.engines_dir / m) for m in work.models}
        sender = InProcessSender(engines, encoders, shape)
        await warm_up(sender, work.warmup, work.warmup_prompts)
        pid = os.getpid()
        cpu = CpuProbe(pid, lambda: {pid: "in-process"}, options.exclude_threads)
        return await run_levels("in-process", sender, work.levels, work.prompts, options, cpu, show)


async def run_bench(options: BenchOptions, argv: list[str], workdir: Path, show: Callable[[dict], None]) -> dict:
    """Every series of the run; the result file's content."""
    notes: list[str] = []
    report = {
        "schema": "inferno-bench/1",
        "command": ["inferno", "bench", *argv],
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": options.as_dict(),
        "machine": machine(),
        "versions": versions(),
    }
    target = open_target(options, workdir)
    main_name = "bare-sse" if target.kind == "bare-sse" else "http"
    try:
        report["target"] = {"kind": target.kind, "api": target.api, "models": target.models, **target.info}
        work = Workload(options, target, notes)
        report["prompts"] = work.describe()
        if not report["prompts"]["isl_exact"]:
            notes.append("prompt lengths are approximate (no tokenizer at hand): see each row's prompt_tokens")
        if target.pid is None:
            notes.append("no server CPU: the server is not on this machine (or give --server-pid)")
        main_rows = await _http_series(main_name, target, work, options, show)
    finally:
        target.stop()
    rows, report["ratios"] = list(main_rows), []
    if options.in_process:
        in_process = await _in_process_series(work, options, show)
        report["ratios"] += ratios(main_rows, in_process, "in-process")
        rows += in_process
    if options.baseline_sse and target.kind != "bare-sse":
        bare = start_bare_sse(options.sse_step_ms, options.sse_burst, workdir / "bare-sse.log")
        try:
            bare_rows = await _http_series("bare-sse", bare, work, options, show)
        finally:
            bare.stop()
        report["ratios"] += ratios(main_rows, bare_rows, "bare-sse")
        rows += bare_rows
    report["rows"] = rows
    report["errors"] = sum(row["errors"] for row in rows)
    if report["errors"]:
        notes.append(f"{report['errors']} requests failed: see error_messages in the rows")
    report["notes"] = notes
    report["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return report

