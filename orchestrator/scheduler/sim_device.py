"""The simulated GPU as the server's memory ledger sees it (a DeviceProbe, scheduler/ledger.py).

A server whose engines are all sim engines places its models on the simulated GPU(s) they were built for,
not on the host: capacity is the simulated GPU's memory (times the largest tensor-parallel size served), and
a model holds what its worker reports it holds there (LoadReport.device_bytes: weights + KV cache + runtime
overhead), not the worker's resident memory. Mixing sim and real engines in one server is refused: the two
would need two ledgers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import psutil

from orchestrator.engine.gpus import SimGpu, find_gpu
from orchestrator.scheduler.ledger import DeviceReading

if TYPE_CHECKING:
    from orchestrator.engine.catalogue import Engine


class MixedEngines(ValueError):
    """Sim engines and real ones (or sim engines of different GPUs) cannot be served by one server."""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class SimulatedDevice:
    """The memory of `count` simulated GPUs; what each worker holds is what it reported at load."""

    def __init__(self, gpu: SimGpu, count: int = 1):
        self.gpu = gpu
        self.name = f"sim:{gpu.name}" if count == 1 else f"sim:{gpu.name}x{count}"
        self.total_bytes = gpu.memory_bytes * count
        self._held: dict[int, int] = {}  # worker pid -> bytes

    def hold(self, pid: int, nbytes: int) -> None:
        """A worker reported what its model holds on the device."""
        self._held[pid] = nbytes

    def read(self) -> DeviceReading:
        used = sum(self._held[pid] for pid in list(self._held) if self.process_bytes(pid))
        return DeviceReading(self.total_bytes, used, self.total_bytes - used)

    def process_bytes(self, pid: int) -> int | None:
        """What a worker holds while it lives; its memory is back once it has exited."""
        if pid in self._held and not _alive(pid):
            del self._held[pid]
        return self._held.get(pid)


def simulated_device(engines: Mapping[str, Engine]) -> SimulatedDevice | None:
    """The simulated device when every engine served is a sim engine; None when none is. MixedEngines else."""
    sims = {name: e.manifest for name, e in engines.items() if e.manifest.backend == "sim"}
    if not sims:
        return None
    real = sorted(set(engines) - set(sims))
    if real:
        raise MixedEngines(
            f"sim engines ({', '.join(sorted(sims))}) and real engines ({', '.join(real)}) cannot be served by one "
            "server: the simulated GPU and the real device would need two memory ledgers. Serve them from two "
            "servers, or choose one kind with --models"
        )
    gpus = {manifest.simulation.gpu for manifest in sims.values()}
    if len(gpus) > 1:
        raise MixedEngines(
            f"these sim engines simulate different GPUs ({', '.join(sorted(gpus))}); one server places models on "
            "one device: rebuild them with the same --sim-gpu, or serve them from two servers"
        )
    count = max(manifest.simulation.gpu_count for manifest in sims.values())
    return SimulatedDevice(find_gpu(gpus.pop()), count)
