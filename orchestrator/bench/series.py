"""Running every level of a run against one series (the target, the in-process backend, the bare SSE
server): prepare, sample CPU, drive the load, sample CPU, summarise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.bench.levels import Level
from orchestrator.bench.load import run_closed, run_open
from orchestrator.bench.options import BenchError, BenchOptions
from orchestrator.bench.proc_cpu import sample_tree, tree_cpu
from orchestrator.bench.senders import Sender
from orchestrator.bench.summary import summarise
from orchestrator.bench.workload import RequestSpec


@dataclass(frozen=True)
class CpuProbe:
    """CPU of a local process tree, named by `roles` (resolved after each level, when workers exist)."""

    root_pid: int
    roles: Callable[[], dict[int, str]]
    exclude: tuple[str, ...]
    floor_us: float | None = None  # the kernel's floor per streamed token measured in the same run (floor.py)

    def sample(self) -> dict:
        return sample_tree(self.root_pid)

    def report(self, before: dict, after: dict, tokens: int) -> dict:
        """Per process (and per thread name) CPU seconds and µs per streamed output token."""
        processes, exited = tree_cpu(before, after, self.roles(), self.exclude)

        def per_token(seconds: float) -> float | None:
            return round(seconds * 1e6 / tokens, 2) if tokens else None

        total = sum(p.cpu_s for p in processes)
        excluded = sum(p.excluded_cpu_s for p in processes)
        report = {
            "cpu_s": round(total, 3),
            "us_per_token": per_token(total),
            "processes": [
                {
                    "pid": p.pid, "role": p.role, "name": p.name, "cpu_s": round(p.cpu_s, 3),
                    "us_per_token": per_token(p.cpu_s), "started_during_level": p.started_in_between,
                    "threads": [
                        {"name": t.name, "threads": t.threads, "cpu_s": round(t.cpu_s, 3), "excluded": t.excluded}
                        for t in p.threads
                    ],
                }
                for p in sorted(processes, key=lambda p: -p.cpu_s)
            ],
            "exited_during_level": exited,
        }
        if self.exclude:
            report |= {"excluded_threads": list(self.exclude), "excluded_cpu_s": round(excluded, 3),
                       "us_per_token_excluding": per_token(total - excluded)}
        if self.floor_us and tokens:
            counted = report.get("us_per_token_excluding", report["us_per_token"])
            report |= {"floor_us_per_token": self.floor_us, "floor_ratio": round(counted / self.floor_us, 2)}
        return report


async def warm_up(sender: Sender, specs: list[RequestSpec], prompts: list[str]) -> None:
    """Send the warm-up requests one at a time; any failure stops the run (with a hint where one helps)."""
    for spec, prompt in zip(specs, prompts, strict=True):
        record = await sender.send(sender.prepare(spec, prompt))
        if not record.ok:
            hint = ""
            if "ignore_eos" in record.error:
                hint = "\n(this server does not accept ignore_eos: rerun with --no-ignore-eos)"
            raise BenchError(f"a warm-up request to model '{spec.model}' failed: {record.error}{hint}")


async def run_levels(
    series: str, sender: Sender, levels: list[Level], prompts: list[list[str]], options: BenchOptions,
    cpu: CpuProbe | None, show: Callable[[dict], None],
) -> list[dict]:
    """One row per level; `show` gets each as soon as it is done."""
    rows = []
    for level, level_prompts in zip(levels, prompts, strict=True):
        prepared = [sender.prepare(s, p) for s, p in zip(level.specs, level_prompts, strict=True)]
        before = cpu.sample() if cpu else None
        if level.arrivals is not None:
            run = await run_open(sender.send, prepared, level.arrivals)
        else:
            run = await run_closed(sender.send, prepared, level.concurrency, options.duration_s)
        after = cpu.sample() if cpu else None
        row = {"series": series, **summarise(run, level.load, options.slo)}
        if cpu:
            row["server_cpu"] = cpu.report(before, after, row["output_tokens"])
        show(row)
        rows.append(row)
    return rows
