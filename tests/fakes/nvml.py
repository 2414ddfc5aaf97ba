"""Stands in for nvidia-ml-py's `pynvml` (there is no NVIDIA driver here): a machine with the given GPUs, answering
the NVML calls orchestrator/visible_gpus.py (and the memory ledger's probe) makes, with NVML's own shapes (a MIG device is found by its UUID)."""

from __future__ import annotations

from dataclasses import dataclass


class NVMLError(Exception):
    pass


@dataclass(frozen=True)
class FakeGpu:
    uuid: str  # "GPU-..." ("MIG-..." for a MIG device)
    name: str
    capability: tuple[int, int]
    memory_bytes: int = 80 * 2**30


@dataclass(frozen=True)
class _Memory:
    total: int
    used: int = 0

    @property
    def free(self) -> int:
        return self.total - self.used


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], mig_devices: tuple[FakeGpu, ...] = ()):  # gpus by NVML index
        self.gpus, self.mig_devices, self.open = gpus, mig_devices, False

    def nvmlInit(self):
        self.open = True

    def nvmlShutdown(self):
        self.open = False

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        found = [device for device in (*self.gpus, *self.mig_devices) if device.uuid == uuid]
        if not found:
            raise NVMLError("Not Found")
        return found[0]

    def nvmlDeviceGetUUID(self, handle):
        return handle.uuid

    def nvmlDeviceGetName(self, handle):
        return handle.name.encode()  # older nvidia-ml-py releases answer bytes

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle.capability

    def nvmlDeviceGetMemoryInfo(self, handle):
        return _Memory(handle.memory_bytes)
