"""Kept weights, in-process on virtual time with the real weight keeper over small real weight files: an unloaded
model's weights are kept in host RAM and counted in the ledger, its next load is told so and uses them, they are
dropped least recently used first within their budget, and before any loaded model is evicted; on the CPU they count
on the device."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from orchestrator.scheduler import Scheduler
from orchestrator.scheduler.ledger import HostProbe
from orchestrator.supervisor.keeper import WeightKeeper
from tests.fakes.clock import run_virtual, until
from tests.fakes.workers import FakeDevice, FakeWorkers
from tests.scheduler.harness import (
    GIB,
    KV_BYTES,
    RecordedEvents,
    advance,
    catalogue,
    model,
    served,
    server_config,
)

MIB = 2**20
MODEL_MIB = 4  # 3 MiB of weights, 1 MiB of KV cache
WEIGHTS = MODEL_MIB * MIB - KV_BYTES


class HostDevice(FakeDevice, HostProbe):
    """The host as the device (models served on the CPU), with `total_bytes` of RAM, all of it free: a FakeDevice
    the ledger takes for the host."""

    name = HostProbe.name


async def on_the_loop(work) -> None:
    """The keeper's blocking work, run at once on the loop: the virtual clock jumps to the next timer whenever the loop
    waits, so work on a thread would race the timers (its files here are a few MiB)."""
    work()


def kept_scheduler(tmp_path: Path, names: tuple[str, ...], device_mib: float, on_host: bool = False,
                   budget_mib: int | None = None) -> tuple[Scheduler, FakeWorkers, RecordedEvents, WeightKeeper]:
    """Models of MODEL_MIB each, with weight files of their weights' bytes, on a device of `device_mib`."""
    config = server_config(tmp_path, device_mib * MIB / GIB, None)
    budget = None if budget_mib is None else budget_mib * MIB
    config = config.model_copy(update={"memory": config.memory.model_copy(update={"kept_weights_bytes": budget})})
    engines = catalogue(dict.fromkeys(names, MODEL_MIB * MIB / GIB), "hf", tmp_path / "engines")
    for engine in engines.engines.values():
        engine.folder.mkdir(parents=True, exist_ok=True)
        (engine.folder / "model.safetensors").write_bytes(os.urandom(WEIGHTS))
    workers, events, keeper = FakeWorkers(), RecordedEvents(), WeightKeeper(off_loop=on_the_loop)
    probe = HostDevice(int(device_mib * MIB)) if on_host else FakeDevice(int(device_mib * MIB))
    scheduler = Scheduler(config, engines, workers, events=events, probe=probe,
                          clock=asyncio.get_running_loop().time, keeper=keeper)
    return scheduler, workers, events, keeper


def kept(scheduler: Scheduler) -> dict[str, int]:
    return {s.name: s.kept_weights.bytes for s in scheduler.snapshot() if s.kept_weights is not None}


def test_an_evicted_models_weights_are_kept_and_its_next_load_uses_them(tmp_path):
    async def go():
        scheduler, workers, events, keeper = kept_scheduler(tmp_path, ("alpha", "beta"), 6)
        await served(scheduler, workers, "alpha")
        await served(scheduler, workers, "beta")  # evicts alpha, whose weights are kept once beta has its room
        await until(lambda: "alpha" in kept(scheduler), "alpha's weights kept")
        await keeper.settled("alpha")
        alpha_kept, ledger = model(scheduler, "alpha").kept_weights, scheduler.memory()
        await served(scheduler, workers, "alpha")  # evicts beta: alpha loads from its kept weights
        await until(lambda: "beta" in kept(scheduler), "beta's weights kept")
        after_swap = kept(scheduler), [w.spec.weights_kept for w in workers.started]
        await scheduler.stop(drain_timeout_s=1)
        return alpha_kept, ledger, after_swap, kept(scheduler), keeper.kept("beta"), events.log

    alpha_kept, ledger, (after_swap, weights_kept), after_stop, beta_files, log = run_virtual(go())
    assert alpha_kept.bytes == WEIGHTS and alpha_kept.pinned and alpha_kept.since > 0
    assert ledger.kept_weights_bytes == WEIGHTS and ledger.host_used_bytes == WEIGHTS
    assert ledger.used_bytes == MODEL_MIB * MIB  # beta's: kept weights are not on a GPU's ledger
    assert after_swap == {"beta": WEIGHTS}  # alpha loaded again: its weights are no longer kept
    assert weights_kept == [False, False, True]  # alpha cold, beta cold, alpha from its kept weights
    assert after_stop == {} and beta_files is None  # shutdown lets go of what is kept
    assert [entry for entry in log if entry[0] == "unloaded"] == [
        ("unloaded", "alpha", "evicted"), ("unloaded", "beta", "evicted"), ("unloaded", "alpha", "shutdown")]


def test_kept_weights_beyond_their_budget_go_least_recently_used_first(tmp_path):
    async def go():
        names = ("a", "b", "c", "d")
        scheduler, workers, _, _ = kept_scheduler(tmp_path, names, 5, budget_mib=7)  # one model; two kept
        seen = []
        for before, name in zip((None, *names), names, strict=False):
            await advance(1)
            await served(scheduler, workers, name)  # evicts the one before, whose weights are then kept
            if before is not None:
                await until(lambda evicted=before: evicted in kept(scheduler), f"{before}'s weights kept")
            seen.append(sorted(kept(scheduler)))
        return seen, scheduler.memory().kept_weights_budget_bytes

    seen, budget = run_virtual(go())
    assert seen == [[], ["a"], ["a", "b"], ["b", "c"]] and budget == 7 * MIB


def test_on_the_cpu_kept_weights_count_on_the_device_and_go_before_any_eviction(tmp_path):
    async def go():
        scheduler, workers, events, _ = kept_scheduler(tmp_path, ("alpha", "beta", "gamma"), 9, on_host=True)
        await served(scheduler, workers, "alpha")
        await served(scheduler, workers, "beta")  # both fit: 8 of 9 MiB
        await scheduler.unload("alpha")
        await until(lambda: "alpha" in kept(scheduler), "alpha's weights kept")
        used_while_kept = scheduler.memory().used_bytes
        await served(scheduler, workers, "gamma")  # 2 MiB free: alpha's kept weights make room, beta stays
        states = {s.name: s.state for s in scheduler.snapshot()}
        return used_while_kept, states, kept(scheduler), events.log

    used_while_kept, states, kept_after, log = run_virtual(go())
    assert used_while_kept == MODEL_MIB * MIB + WEIGHTS  # beta, and alpha's kept weights
    assert states == {"alpha": "unloaded", "beta": "ready", "gamma": "ready"} and kept_after == {}
    assert ("unloaded", "beta", "evicted") not in log
