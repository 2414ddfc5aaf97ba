"""The memory ledger: what the device holds, what each model takes, and whether a load fits.

A model's footprint is estimated from its manifest (weights + KV cache budget + runtime overhead) until it
has been loaded once; then it is measured (the worker's GPU memory through NVML, or its resident memory on
the CPU) and the measurement replaces the estimate, for this load and the next ones. A worker on a simulated
GPU (orchestrator/scheduler/sim_device.py) reports what it holds there instead, and that report is taken as is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import psutil

from orchestrator.visible_gpus import visible_handles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceReading:
    total_bytes: int
    used_bytes: int
    free_bytes: int


class DeviceProbe(Protocol):
    name: str  # "cuda:0", "cpu"

    def read(self) -> DeviceReading: ...

    def process_bytes(self, pid: int) -> int | None: ...  # memory a process tree holds on this device


@runtime_checkable
class ReportedDevice(Protocol):
    """A device whose memory use is what the workers report (a simulated GPU), not something measured."""

    def hold(self, pid: int, nbytes: int) -> None: ...


class HostProbe:
    """System RAM: for models served on the CPU."""

    name = "cpu"

    def read(self) -> DeviceReading:
        memory = psutil.virtual_memory()
        return DeviceReading(memory.total, memory.total - memory.available, memory.available)

    def process_bytes(self, pid: int) -> int | None:
        try:
            root = psutil.Process(pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return None


class NvmlProbe:
    """One NVIDIA GPU, through NVML (nvidia-ml-py), by its NVML handle."""

    def __init__(self, pynvml, handle, index: int):
        self._nvml = pynvml
        self._handle = handle
        self.name = f"cuda:{index}"

    def read(self) -> DeviceReading:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return DeviceReading(info.total, info.used, info.free)

    def process_bytes(self, pid: int) -> int | None:
        try:
            tree = {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
            running = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except (psutil.Error, self._nvml.NVMLError):
            return None
        used = [p.usedGpuMemory for p in running if p.pid in tree and p.usedGpuMemory is not None]
        return sum(used) if used else None  # pids from another namespace are not visible


def detect_probe(device: str, index: int = 0) -> DeviceProbe:
    """The GPU CUDA numbers `index` in this process (CUDA_VISIBLE_DEVICES applied as CUDA applies it, so the
    index means the GPU the workers' CUDA calls index) when NVML sees it and models are not forced onto the
    CPU, else the host."""
    if device == "cpu":
        return HostProbe()
    try:
        import pynvml

        pynvml.nvmlInit()
        devices = visible_handles(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if index < len(devices):
            return NvmlProbe(pynvml, devices[index][0], index)
        problem = f"{len(devices)} visible GPU(s), none with CUDA index {index}"
    except Exception as exc:  # no driver, no library, no device
        problem = str(exc)
    if device == "cuda":
        log.warning("no NVIDIA GPU visible through NVML (%s): accounting memory on the host", problem)
    return HostProbe()


@dataclass
class _Entry:
    footprint: int
    measured: bool


class MemoryLedger:
    def __init__(self, probe: DeviceProbe, capacity_bytes: int | None, reserve_bytes: int | None):
        self.probe = probe
        reading = probe.read()
        self.capacity = capacity_bytes or reading.total_bytes
        self.reserve = reserve_bytes if reserve_bytes is not None else self.capacity // 10
        self._entries: dict[str, _Entry] = {}
        self._measured: dict[str, int] = {}  # the last measurement of each model, for its next load

    @property
    def usable(self) -> int:
        return max(0, self.capacity - self.reserve)

    @property
    def used(self) -> int:
        return sum(e.footprint for e in self._entries.values())

    def footprint(self, model: str) -> int:
        entry = self._entries.get(model)
        return entry.footprint if entry else 0

    def free(self) -> int:
        """Room for another model: the ledger's own view, never more than the device really has free."""
        device_free = self.probe.read().free_bytes
        return max(0, min(self.usable - self.used, device_free))

    def estimate(self, model: str, weights_bytes: int, kv_bytes: int, overhead_bytes: int) -> int:
        return self._measured.get(model, weights_bytes + kv_bytes + overhead_bytes)

    def reserve_for(self, model: str, estimate: int) -> None:
        self._entries[model] = _Entry(estimate, measured=False)

    def commit(self, model: str, pid: int, fallback: int | None = None, device_bytes: int | None = None) -> int:
        """After a load: measure the worker and make that the model's footprint. `device_bytes`, what the worker
        reported holding on the device (LoadReport.device_bytes), is preferred to a measurement."""
        if device_bytes is not None and isinstance(self.probe, ReportedDevice):
            self.probe.hold(pid, device_bytes)
        measured = device_bytes or self.probe.process_bytes(pid) or fallback
        entry = self._entries[model]
        if measured:
            log.info(
                "%s: %s %.0f MiB on %s (estimated %.0f MiB)", model, "reported" if device_bytes else "measured",
                measured / 2**20, self.probe.name, entry.footprint / 2**20,
            )
            entry.footprint, entry.measured = measured, True
            self._measured[model] = measured
        return entry.footprint

    def release(self, model: str) -> None:
        self._entries.pop(model, None)

    def returned(self, pid: int) -> bool:
        """After an unload: the worker's memory is back (its process tree holds nothing on the device)."""
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        return not self.probe.process_bytes(pid)
