"""`python -m bench.soak`: the options, the run (run.py), the verdict (series.py), the result's JSON, table and
plot in bench/results/, and the verdict printed. Exit status 1 when the verdict fails or any request was
answered as it must not be, 2 when the run cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench.soak.report import failed_reasons, markdown, plot, text_table
from bench.soak.run import SoakOptions, run_soak
from bench.soak.series import verdict
from bench.soak.servers import SIM_HOT, SimEngines, SoakError
from orchestrator import aio
from orchestrator.bench.cli import stoppable
from orchestrator.bench.report import machine, versions, write

PROG = "python -m bench.soak"


def parse_options(argv: list[str]) -> tuple[SoakOptions, Path, bool]:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Mixed traffic against real servers for a long time: does anything grow without bound?",
    )
    parser.add_argument("--duration-s", type=float, default=1800.0, help="seconds of traffic, warm-up included")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=0, help="seeds every random choice of the traffic")
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    parser.add_argument("--model", default="smollm2-135m",
                        help="the real engine in the mix (its server is the report's \"hf\" one)")
    parser.add_argument("--no-hf", action="store_true", help="sim engines only")
    parser.add_argument("--sim-tokenizer", type=Path, help="a sim engine or checkpoint to take the sim engines' "
                        "tokenizer from (default: extract the stand-in, about 20 s)")
    parser.add_argument("--sim-speedup", type=float, default=1.0)
    parser.add_argument("--sim-load-s", type=float, default=1.0, help="simulated load time of a sim model")
    parser.add_argument("--clients", type=int, default=6, help="concurrent clients on the pinned sim model")
    parser.add_argument("--swap-clients", type=int, default=2, help="concurrent clients on the swapping pair")
    parser.add_argument("--hf-clients", type=int, default=1, help="concurrent clients on the real model")
    parser.add_argument("--phase-s", type=float, help="seconds between swaps (default: duration / 30, at least 5)")
    parser.add_argument("--admin-every", type=int, default=3, help="every n-th swap through the admin API")
    parser.add_argument("--quiet-samples", type=int, default=3)
    parser.add_argument("--settle-timeout-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    problems = [f"--{name.replace('_', '-')} must be positive (got {value})"
                for name, value in (("duration_s", args.duration_s), ("sample_s", args.sample_s),
                                    ("quiet_samples", args.quiet_samples), ("admin_every", args.admin_every),
                                    ("clients", args.clients), ("sim_speedup", args.sim_speedup))
                if value <= 0]
    problems += [f"--{name.replace('_', '-')} must not be negative (got {value})"
                 for name, value in (("swap_clients", args.swap_clients), ("hf_clients", args.hf_clients),
                                     ("sim_load_s", args.sim_load_s)) if value < 0]
    problems += [f"--{name.replace('_', '-')} must be positive (got {value})"
                 for name, value in (("phase_s", args.phase_s), ("settle_timeout_s", args.settle_timeout_s))
                 if value is not None and value <= 0]
    if problems:
        parser.error("; ".join(problems))
    options = SoakOptions(
        duration_s=args.duration_s, sample_s=args.sample_s, seed=args.seed,
        hf_engine=None if args.no_hf or not args.hf_clients else args.engines_dir / args.model,
        sim=SimEngines(args.sim_speedup, args.sim_load_s, args.sim_tokenizer),
        sim_clients=args.clients, swap_clients=args.swap_clients, hf_clients=args.hf_clients,
        phase_s=args.phase_s or max(5.0, args.duration_s / 30), admin_every=args.admin_every,
        quiet_samples=args.quiet_samples, settle_timeout_s=args.settle_timeout_s, grace_s=60.0,
    )
    return options, args.out, not args.no_plot


def finish(report: dict, out: Path, draw: bool) -> Path:
    """Write the JSON, the plot and the markdown table next to each other; returns the JSON's path."""
    path = write(report, out, prefix="soak")
    if draw:
        png = path.with_suffix(".png")
        note = plot(report["samples"], png)
        report["plot"] = None if note else str(png)
        if note:
            report["notes"].append(note)
    report["table"] = str(path.with_suffix(".md"))
    path.with_suffix(".md").write_text(markdown(report))
    path.write_text(json.dumps(report, indent=2))
    return path


def main(argv: list[str]) -> int:
    options, out, draw = parse_options(argv)
    started, host = datetime.now(UTC).isoformat(timespec="seconds"), machine()
    try:
        with tempfile.TemporaryDirectory(prefix="inferno-bench-soak-") as workdir:
            result = aio.run(stoppable(run_soak(options, Path(workdir))))
    except SoakError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"{PROG}: stopped; no result written", file=sys.stderr)
        return 130
    pinned = {"sim": [SIM_HOT], "hf": [options.hf_engine.name] if options.hf_engine else []}
    settle_s = f"{options.settle_timeout_s:g} s"
    settled = [{"server": "all", "values": [], "passed": ok,
                "check": f"settled within {settle_s} once traffic stopped (before the {phase} samples)"}
               for phase, ok in result["periods"]["settled_in_time"].items()]
    judged = verdict(result["samples"], pinned, settled)
    report = {"schema": "inferno-bench-soak/1", "command": [*PROG.split(), *argv], "started_at": started,
              "seed": options.seed, "duration_s": options.duration_s, "sample_s": options.sample_s,
              "machine": host, "versions": versions(), **result, "verdict": judged, "notes": []}
    path = finish(report, out, draw)
    print(text_table(judged))
    for line in failed_reasons(judged):
        print(f"FAILED: {line}")
    for server, facts in result["servers"].items():
        if facts["log_problems"]["count"]:
            print(f"note: the {server} server logged {facts['log_problems']['count']} entries at ERROR level or with "
                  f"a traceback (the first few are in the result)")
    failures = result["traffic"]["failures"]
    print(f"traffic: {failures} failed request(s); seed {options.seed}")
    print(f"verdict: {'nothing grew without bound' if judged['passed'] else 'FAILED'}")
    print(f"wrote {path}, {report['table']}" + (f", {report['plot']}" if report.get("plot") else ""))
    return 0 if judged["passed"] and not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
