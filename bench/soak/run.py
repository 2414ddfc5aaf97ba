"""One soak run: the servers start (servers.py); a warm-up (a tenth of the duration) of traffic; a quiet
period that takes the idle baseline; the rest of the duration of traffic; a quiet period after it. Every
sample and every count comes back in one dict, for the verdict (series.py) and the report (report.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.soak.control import admin_call, placement
from bench.soak.sampler import Sampler, Watched, read_metrics
from bench.soak.servers import (
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
from bench.soak.tally import Tally
from bench.soak.traffic import Mix, Period, ServerTraffic, SwapState
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
