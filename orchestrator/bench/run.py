"""One `inferno bench` run: the target's series, then any baselines' series on the same levels and the
ratios between them. Returns the whole result as one dict."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.bench.floor import measure_apart
from orchestrator.bench.levels import WARMUP_SEED_OFFSET, plan_levels, warmup_specs
from orchestrator.bench.options import BenchError, BenchOptions
from orchestrator.bench.prompts import PromptMaker, prompts_for
from orchestrator.bench.report import header, now, ratios
from orchestrator.bench.senders import HttpSender, RequestShape
from orchestrator.bench.series import CpuProbe, run_levels, warm_up
from orchestrator.bench.summary import client_stalls
from orchestrator.bench.targets import Target, connect, start_inferno
from orchestrator.bench.workload import ModelMix, RequestSpec

Show = Callable[[dict], None]  # prints a row as soon as its level ends


def open_target(options: BenchOptions, workdir: Path) -> Target:
    names = list(options.models.names) if options.models else []
    if options.url:
        return connect(options.url, names, options.api_key, options.server_pid, options.tokenizer)
    if options.engines_dir:
        threads = ["--worker.threads", str(options.engine_threads)] if options.engine_threads else []
        return start_inferno(options.engines_dir, names, [*threads, *options.server_args], workdir / "server.log")
    raise BenchError("give a target: --url URL or --engines-dir DIR")


class Workload:
    """The levels, their prompts and the warm-up, made once for every series."""

    def __init__(self, options: BenchOptions, target: Target, notes: list[str], floor_us: float | None = None):
        """Raises BenchError for a trace that cannot be read or a length no prompt can have. `floor_us`: the
        kernel's floor measured in this run (every series' server CPU is set against it)."""
        self.floor_us = floor_us
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


@dataclass(frozen=True)
class Baseline:
    """A series run after the target's (its server stopped by then) on the same levels, prompts and warm-up,
    and set against it in the result's ratios. `inferno bench` has none of its own; the dev comparisons in the
    repository's bench/baselines.py add theirs (the backend driven in-process, a bare aiohttp SSE server),
    since such ratios hold only within one run on one machine."""

    name: str  # its rows' series, and what the ratios are of
    run: Callable[[Workload, BenchOptions, Path, Show], Awaitable[list[dict]]]  # (..., workdir, show) -> rows
    settings: dict = field(default_factory=dict)  # recorded in the result's settings, under `baselines`


async def http_series(name: str, target: Target, work: Workload, options: BenchOptions, show: Show) -> list[dict]:
    """The workload sent to `target` over HTTP: the warm-up, then every level."""
    shape = RequestShape(options.chat, options.ignore_eos, options.temperature)
    sender = HttpSender(target.api, shape, options.timeout_s, options.api_key)
    cpu = CpuProbe(target.pid, target.roles, options.exclude_threads, work.floor_us) if target.pid else None
    try:
        await warm_up(sender, work.warmup, work.warmup_prompts)
        return await run_levels(name, sender, work.levels, work.prompts, options, cpu, show)
    finally:
        sender.close()


async def _floor(options: BenchOptions, notes: list[str]) -> dict | None:
    """The kernel's floor on this machine now (floor.py), before the target starts; None if not asked for."""
    if not options.floor_rounds:
        return None
    try:
        return await measure_apart(options.floor_rounds, options.floor_sockets())
    except RuntimeError as exc:
        notes.append(str(exc))
        return None


async def run_bench(
    options: BenchOptions, command: list[str], workdir: Path, show: Show,
    target_of: Callable[[BenchOptions, Path], Target] = open_target, baselines: Sequence[Baseline] = (),
) -> dict:
    """Every series; the result file's content. The target (`target_of`; by default the one the options name)
    is stopped as soon as its series is done, before any baseline runs."""
    notes: list[str] = []
    report = header("inferno-bench/1", command,
                    options.as_dict() | {"baselines": {b.name: b.settings for b in baselines}})
    report["floor"] = await _floor(options, notes)
    target = target_of(options, workdir)
    try:
        report["target"] = target.describe()
        work = Workload(options, target, notes, report["floor"] and report["floor"]["us_per_write"])
        report["prompts"] = work.describe()
        if not report["prompts"]["isl_exact"]:
            notes.append("prompt lengths are approximate (no tokenizer at hand): see each row's prompt_tokens")
        if target.pid is None:
            notes.append("no server CPU: the server is not on this machine (or give --server-pid)")
        main_rows = await http_series(target.series, target, work, options, show)
    finally:
        target.stop()
    rows, report["ratios"] = list(main_rows), []
    for baseline in baselines:
        baseline_rows = await baseline.run(work, options, workdir, show)
        report["ratios"] += ratios(main_rows, baseline_rows, baseline.name)
        rows += baseline_rows
    report["rows"] = rows
    notes += [note for row in rows if (note := client_stalls(row))]
    report["errors"] = sum(row["errors"] for row in rows)
    if report["errors"]:
        notes.append(f"{report['errors']} requests failed: see error_messages in the rows")
    report["notes"] = notes
    report["finished_at"] = now()
    return report
