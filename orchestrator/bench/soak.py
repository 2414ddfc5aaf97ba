"""`inferno bench soak`: a long run of mixed traffic against real servers, watching that nothing grows without
bound. Streams, non-streaming requests, streams the client cuts, invalid requests, model swaps (by traffic
and through the admin API) and probes, all at once; the RSS, open fds and threads of every server process
and the HTTP process's asyncio tasks sampled over time; a table, a plot and a verdict.

    inferno bench soak [--duration-s 1800] [--sample-s 5] [--seed 0] [--engines-dir engines]
                       [--model smollm2-135m | --no-hf] [--out bench/results]

The run: servers start (soak_servers.py); a warm-up (a tenth of the duration) of traffic; a quiet period
that takes the idle baseline; the rest of the duration of traffic; a quiet period after it. The verdict
(soak_series.py, soak_verdict.py) judges growth over the traffic's last two thirds and the return to the
idle baseline. Exit status 1 when the verdict fails or any request was answered as it must not be.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from orchestrator import aio
from orchestrator.bench.cli import stoppable
from orchestrator.bench.report import machine, versions, write
from orchestrator.bench.soak_control import admin_call, placement
from orchestrator.bench.soak_report import failed_reasons, markdown, plot, text_table
from orchestrator.bench.soak_sampler import Sampler, Watched, read_metrics
from orchestrator.bench.soak_series import verdict
from orchestrator.bench.soak_servers import (
    SIM_CAPACITY_BYTES,
    SIM_HOT,
    SIM_KV_BYTES,
    SIM_PAIR,
    SimEngines,
    SoakError,
    log_problems,
    make_hf_engines,
    make_sim_engines,
    start_hf,
    start_sim,
)
from orchestrator.bench.soak_tally import Tally
from orchestrator.bench.soak_traffic import Mix, Period, ServerTraffic, SwapState
from orchestrator.launch import ServerProcess

WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class SoakOptions:
    duration_s: float
    sample_s: float
    seed: int
    hf_engine: Path | None
    sim: SimEngines
    sim_clients: int
    swap_clients: int
    hf_clients: int
    phase_s: float
    admin_every: int
    quiet_samples: int
    settle_timeout_s: float
    grace_s: float


@dataclass
class Servers:
    """The running servers of the run, by name, and how each was started."""

    processes: dict[str, ServerProcess]
    args: dict[str, list[str]]

    def stop(self) -> None:
        for server in self.processes.values():
            server.stop()


def traffic_plan(options: SoakOptions, servers: Servers) -> list[ServerTraffic]:
    plan = []
    if "sim" in servers.processes:
        plan.append(ServerTraffic(
            "sim", servers.processes["sim"].base_url, (SIM_HOT,), options.sim_clients, Mix(),
            SIM_PAIR, options.swap_clients, options.phase_s, options.admin_every, bad_every_s=0.4,
            probe_every_s=1.0,
        ))
    if "hf" in servers.processes:
        hf = Mix(max_tokens=(4, 24), pause_s=(0.5, 2.0))
        plan.append(ServerTraffic("hf", servers.processes["hf"].base_url, (options.hf_engine.name,),
                                  options.hf_clients, hf, bad_every_s=5.0, probe_every_s=3.0, timeout_s=300.0))
    return plan


async def start_servers(options: SoakOptions, workdir: Path) -> Servers:
    """Make the engines and start the servers side by side; a server that started is stopped if another fails."""
    starts = {"sim": asyncio.to_thread(lambda: start_sim(workdir, make_sim_engines(workdir, options.sim)))}
    if options.hf_engine is not None:
        engine = options.hf_engine
        starts["hf"] = asyncio.to_thread(lambda: start_hf(workdir, make_hf_engines(workdir, engine), engine.name))
    starting = asyncio.gather(*starts.values(), return_exceptions=True)
    try:
        results = await asyncio.shield(starting)
    except asyncio.CancelledError:  # the threads go on starting servers: let them, then stop what they started
        _servers(starts, await _outlast_cancels(starting)).stop()
        raise
    servers = _servers(starts, results)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        servers.stop()
        raise SoakError(str(failed[0])) from failed[0]
    return servers


async def _outlast_cancels(starting: asyncio.Future) -> list:
    """The result of `starting`, waited for through any further cancellation (a second Ctrl-C, SIGTERM, the
    event loop cancelling what is left as it closes): threads cannot be cancelled, and a server one of them
    starts must be stopped. Each start ends within its own ready timeout."""
    while True:
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            continue


def _servers(names: dict[str, object], results: list) -> Servers:
    """The servers whose start succeeded: `results` (a server and its arguments, or an exception) in the order
    of `names`."""
    started = {name: r for name, r in zip(names, results, strict=True) if not isinstance(r, BaseException)}
    return Servers({name: r[0] for name, r in started.items()}, {name: r[1] for name, r in started.items()})


async def _settled(session: aiohttp.ClientSession, server: ServerProcess) -> bool:
    """Quiet: nothing in flight, and the spare worker warm again."""
    if (await placement(session, server.base_url))["spare_worker"] != "warm":
        return False
    return (await asyncio.to_thread(read_metrics, server.base_url))["in_flight"] == 0


async def quiet(servers: Servers, swaps: dict[str, SwapState], sampler: Sampler, phase: str,
                options: SoakOptions, tally: Tally) -> bool:
    """Traffic has stopped: bring the pair back to its first model, wait for the servers to settle (within
    the settle timeout), then take the quiet samples. Returns whether they settled in time."""
    sampler.phase = "settling"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for name, state in swaps.items():
            tally.add(name, await admin_call(session, servers.processes[name].base_url, state.models[0], "load"))
            state.current = 0
        deadline = time.monotonic() + options.settle_timeout_s
        while not (settled := all([await _settled(session, s) for s in servers.processes.values()])):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    sampler.phase = None
    for index in range(options.quiet_samples):
        if index:
            await asyncio.sleep(options.sample_s)
        await sampler.take(phase)
    return settled


async def drive(options: SoakOptions, servers: Servers, sampler: Sampler, tally: Tally) -> dict:
    """Warm-up, idle baseline, traffic, quiet: returns what the periods reported."""
    plan = traffic_plan(options, servers)
    swaps = {t.name: SwapState(t.swap_models) for t in plan if t.swap_models}
    warmup_s = options.duration_s * WARMUP_FRACTION
    sampler.phase = "warmup"
    cancelled = {"warmup": await Period(plan, swaps, tally, f"{options.seed}:warmup").run(warmup_s, options.grace_s)}
    settled = {"baseline": await quiet(servers, swaps, sampler, "baseline", options, tally)}
    sampler.phase = "traffic"
    cancelled["traffic"] = await Period(plan, swaps, tally, f"{options.seed}:traffic").run(
        options.duration_s - warmup_s, options.grace_s)
    settled["quiet"] = await quiet(servers, swaps, sampler, "quiet", options, tally)
    return {"plan": {t.name: t.describe() for t in plan}, "actors_cancelled_at_stop": cancelled,
            "settled_in_time": settled, "swap_changes": {name: s.changes for name, s in swaps.items()}}


async def run_soak(options: SoakOptions, workdir: Path) -> dict:
    """Start the servers, drive the traffic, stop the servers; the report without the verdict."""
    servers = await start_servers(options, workdir)
    started = time.monotonic()
    watched = [Watched(name, server.pid, server.base_url) for name, server in servers.processes.items()]
    sampler, tally = Sampler(watched, options.sample_s, started), Tally()
    sampling = asyncio.create_task(sampler.run())
    try:
        periods = await drive(options, servers, sampler, tally)
    finally:
        sampling.cancel()
        servers.stop()
    return {
        "servers": {name: {"args": servers.args[name], "log_problems": log_problems(server)}
                    for name, server in servers.processes.items()},
        "sim": {"models": {"pinned": SIM_HOT, "pair": list(SIM_PAIR)}, "kv_cache_bytes": SIM_KV_BYTES,
                "capacity_bytes": SIM_CAPACITY_BYTES, "speedup": options.sim.speedup, "load_s": options.sim.load_s},
        "hf": None if options.hf_engine is None else {"engine": str(options.hf_engine)},
        "periods": periods, "traffic": tally.report(), "samples": sampler.samples,
        "wall_s": round(time.monotonic() - started, 1),
    }


def parse_options(argv: list[str]) -> tuple[SoakOptions, Path, bool]:
    parser = argparse.ArgumentParser(prog="inferno bench soak", description=__doc__.splitlines()[0])
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


def soak_command(argv: list[str]) -> int:
    options, out, draw = parse_options(argv)
    started, host = datetime.now(UTC).isoformat(timespec="seconds"), machine()
    try:
        with tempfile.TemporaryDirectory(prefix="inferno-bench-soak-") as workdir:
            result = aio.run(stoppable(run_soak(options, Path(workdir))))
    except SoakError as exc:
        print(f"inferno bench soak: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("inferno bench soak: stopped; no result written", file=sys.stderr)
        return 130
    pinned = {"sim": [SIM_HOT], "hf": [options.hf_engine.name] if options.hf_engine else []}
    settle_s = f"{options.settle_timeout_s:g} s"
    settled = [{"server": "all", "values": [], "passed": ok,
                "check": f"settled within {settle_s} once traffic stopped (before the {phase} samples)"}
               for phase, ok in result["periods"]["settled_in_time"].items()]
    judged = verdict(result["samples"], pinned, settled)
    report = {"schema": "inferno-bench-soak/1", "command": ["inferno", "bench", "soak", *argv], "started_at": started,
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
