"""The simulated GPU in the memory ledger: capacity from the simulated GPU, footprints from what workers
report (LoadReport.device_bytes), memory that comes back when a worker exits, and no mixing with real engines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.engine.catalogue import Engine
from orchestrator.engine.gpus import GPUS
from orchestrator.engine.manifest import load_manifest
from orchestrator.scheduler.ledger import HostProbe, MemoryLedger
from orchestrator.scheduler.sim_device import MixedEngines, SimulatedDevice, simulated_device
from tests.sim.conftest import build_fast, real_engine_folder

GIB = 2**30


def engine(folder: Path, name: str | None = None) -> Engine:
    return Engine(name or folder.name, folder, load_manifest(folder), prompts=None)


def test_footprints_are_what_workers_report_on_the_simulated_gpu():
    device = SimulatedDevice(GPUS["h100-sxm"])
    ledger = MemoryLedger(device, capacity_bytes=None, reserve_bytes=None)
    assert ledger.capacity == 81_559 * 2**20 and ledger.reserve == ledger.capacity // 10
    ledger.reserve_for("a", 30 * GIB)
    assert ledger.commit("a", os.getpid(), fallback=123, device_bytes=33 * GIB) == 33 * GIB
    assert device.read().used_bytes == 33 * GIB and device.process_bytes(os.getpid()) == 33 * GIB
    assert ledger.free() == ledger.usable - 33 * GIB
    assert ledger.estimate("a", 1, 1, 1) == 33 * GIB  # the next load of "a" starts from what it reported


def test_a_workers_simulated_memory_comes_back_when_it_exits():
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    device = SimulatedDevice(GPUS["h100-sxm"], count=2)
    ledger = MemoryLedger(device, None, 0)
    ledger.reserve_for("m", GIB)
    ledger.commit("m", worker.pid, device_bytes=5 * GIB)
    worker.wait()
    ledger.release("m")
    assert ledger.returned(worker.pid) and device.read().used_bytes == 0
    assert device.name == "sim:h100-sxmx2" and ledger.capacity == 2 * GPUS["h100-sxm"].memory_bytes


def test_a_real_device_still_measures_unless_the_worker_reports():
    ledger = MemoryLedger(HostProbe(), None, 0)
    ledger.reserve_for("hf", 10 * GIB)
    measured = ledger.commit("hf", os.getpid())
    assert 20 * 2**20 < measured < 10 * GIB  # this process's resident memory, not the estimate
    ledger.reserve_for("reported", GIB)
    assert ledger.commit("reported", os.getpid(), device_bytes=3 * GIB) == 3 * GIB


def test_the_simulated_device_is_chosen_only_when_every_engine_is_simulated(sim_engine_dir, tmp_path):
    sim = engine(sim_engine_dir)
    device = simulated_device({"a": sim, "b": engine(sim_engine_dir, "b")})
    assert device.name == "sim:h100-sxm" and device.total_bytes == GPUS["h100-sxm"].memory_bytes
    hf = engine(real_engine_folder(sim_engine_dir, tmp_path / "smollm2-135m"))
    assert simulated_device({"smollm2-135m": hf}) is None
    with pytest.raises(MixedEngines, match=r"sim engines \(a\) and real engines \(smollm2-135m\) cannot be served"):
        simulated_device({"a": sim, "smollm2-135m": hf})


def test_sim_engines_of_different_gpus_are_not_served_together(sim_engine_dir, tmp_path):
    h200 = build_fast(tmp_path, "on-h200", "--checkpoint", str(sim_engine_dir), "--sim-gpu", "h200")
    with pytest.raises(MixedEngines, match=r"simulate different GPUs \(h100-sxm, h200\)"):
        simulated_device({"a": engine(sim_engine_dir), "b": engine(h200)})
    tp2 = build_fast(tmp_path, "tp2", "--checkpoint", str(sim_engine_dir), "--tp", "2")
    two_gpus = simulated_device({"a": engine(sim_engine_dir), "b": engine(tp2)})
    assert two_gpus.total_bytes == 2 * GPUS["h100-sxm"].memory_bytes
