"""The memory ledger: what the device holds, what each model takes, and whether a load fits.

A model's footprint is estimated from its manifest (weights + KV cache budget + runtime overhead) until it
has been loaded once; then it is measured (the worker's GPU memory through NVML, or its resident memory on
the CPU) and the measurement replaces the estimate, for this load and the next ones. A worker on a simulated
GPU (orchestrator/scheduler/sim_device.py) reports what it holds there instead, and that report is taken as is.

Pinned host RAM is a second resource: a model's host KV tier (its `prompt_cache_bytes` setting) and its generation
logits pool (trtllm with `generation_logits` on: its `generation_logits_bytes`, which admission shares out among the
requests that ask for top_logprobs; engine/logits.py) hold that many bytes of the host's memory for as long as it is
loaded, and loads are refused beyond the host's capacity less its
reserve as they are beyond the device's. It is the setting's value, never measured (a pinned pool is allocated
whole at load; llama.cpp's RAM cache grows to its budget). Where the device is the host itself (models served on
the CPU), the host tier is part of the device's memory and counted there.

Kept weights are a third kind of holding: an unloaded model's weight files held in host RAM for its next load
(supervisor/keeper.py), counted apart from loaded models and host tiers, within a budget of their own
(`memory.kept_weights_bytes`), in the host's RAM (on the device where the device is the host). Placement drops them
before it evicts any loaded model (`policy.plan_load`), and a model that loads again stops being kept: its load uses
them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import psutil

from orchestrator.scheduler.policy import KeptWeights, Memory
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
    footprint: int  # on the device
    measured: bool
    host: int = 0  # pinned host RAM (the model's host KV tier and generation logits pool)


@dataclass
class _Kept:
    bytes: int
    last_used: float  # the model's, for least recently used first


class MemoryLedger:
    def __init__(self, probe: DeviceProbe, capacity_bytes: int | None, reserve_bytes: int | None,
                 host_capacity_bytes: int | None = None, host_reserve_bytes: int | None = None,
                 kept_budget_bytes: int | None = None):
        self.probe = probe
        reading = probe.read()
        self.capacity = capacity_bytes or reading.total_bytes
        self.reserve = reserve_bytes if reserve_bytes is not None else self.capacity // 10
        # The host's RAM for host KV tiers; where the device is the host, they are counted on the device instead.
        self.host_on_device = isinstance(probe, HostProbe)
        self._host = HostProbe()
        self.host_capacity = host_capacity_bytes or self._host.read().total_bytes
        self.host_reserve = host_reserve_bytes if host_reserve_bytes is not None else self.host_capacity // 4
        self._entries: dict[str, _Entry] = {}
        self._measured: dict[str, int] = {}  # the last measurement of each model, for its next load
        self._kept: dict[str, _Kept] = {}
        # Kept weights' budget: by default half of the host RAM the ledger offers (of the device's, on the host).
        self.kept_budget = kept_budget_bytes if kept_budget_bytes is not None else (
            self.usable if self.host_on_device else self.host_usable) // 2

    @property
    def usable(self) -> int:
        return max(0, self.capacity - self.reserve)

    @property
    def host_usable(self) -> int:
        return 0 if self.host_on_device else max(0, self.host_capacity - self.host_reserve)

    @property
    def used(self) -> int:
        models = sum(e.footprint + (e.host if self.host_on_device else 0) for e in self._entries.values())
        return models + (self.kept_used if self.host_on_device else 0)

    @property
    def host_used(self) -> int:
        return 0 if self.host_on_device else sum(e.host for e in self._entries.values()) + self.kept_used

    @property
    def kept_used(self) -> int:
        return sum(k.bytes for k in self._kept.values())

    def footprint(self, model: str) -> int:
        entry = self._entries.get(model)
        return entry.footprint + (entry.host if self.host_on_device else 0) if entry else 0

    def held(self, model: str) -> Memory:
        """What the model holds, as placement weighs it: on the device, and in pinned host RAM."""
        entry = self._entries.get(model)
        return Memory(self.footprint(model), 0 if entry is None or self.host_on_device else entry.host)

    def free(self) -> int:
        """Room for another model: the ledger's own view, never more than the device really has free."""
        device_free = self.probe.read().free_bytes
        return max(0, min(self.usable - self.used, device_free))

    def host_free(self) -> int:
        """Pinned host RAM left for host KV tiers: the ledger's view, never more than the host has available."""
        return 0 if self.host_on_device else max(0, min(self.host_usable - self.host_used, self._host.read().free_bytes))

    def room(self) -> Memory:
        return Memory(self.free(), self.host_free())

    def usable_memory(self) -> Memory:
        return Memory(self.usable, self.host_usable)

    def need(self, device_bytes: int, host_bytes: int) -> Memory:
        """What a load needs, as placement weighs it (the host tier on the device where the device is the host)."""
        return Memory(device_bytes + host_bytes, 0) if self.host_on_device else Memory(device_bytes, host_bytes)

    # -- kept weights ---------------------------------------------------------------------------------------
    def kept_need(self, nbytes: int) -> Memory:
        """Where `nbytes` of kept weights count: on the device where it is the host, else in host RAM."""
        return Memory(nbytes, 0) if self.host_on_device else Memory(0, nbytes)

    def kept_weights(self, except_model: str | None = None) -> list[KeptWeights]:
        return [KeptWeights(name, self.kept_need(k.bytes), k.last_used)
                for name, k in self._kept.items() if name != except_model]

    def kept_bytes(self, model: str) -> int:
        kept = self._kept.get(model)
        return 0 if kept is None else kept.bytes

    def keep(self, model: str, nbytes: int, last_used: float) -> None:
        self._kept[model] = _Kept(nbytes, last_used)

    def drop(self, model: str) -> bool:
        """The model's weights are no longer kept; True when they were."""
        return self._kept.pop(model, None) is not None

    def estimate(self, model: str, weights_bytes: int, kv_bytes: int, overhead_bytes: int) -> int:
        return self._measured.get(model, weights_bytes + kv_bytes + overhead_bytes)

    def reserve_for(self, model: str, estimate: int, host_bytes: int = 0) -> bool:
        """Hold `estimate` bytes of the device and `host_bytes` of pinned host RAM for a model about to load. Its kept
        weights, if any, stop counting as such (its load uses them); True when there were."""
        self._entries[model] = _Entry(estimate, measured=False, host=host_bytes)
        return self.drop(model)

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

    def release(self, model: str, spare_pid: int | None = None) -> None:
        """The model is unloaded. `spare_pid`: its worker lives on as a spare, its engine's memory given back
        (it said so, with its resident memory checked): a simulated device no longer counts it."""
        self._entries.pop(model, None)
        if spare_pid is not None and isinstance(self.probe, ReportedDevice):
            self.probe.hold(spare_pid, 0)

    def returned(self, pid: int) -> bool:
        """After an unload: the worker's memory is back (its process tree holds nothing on the device)."""
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        return not self.probe.process_bytes(pid)
