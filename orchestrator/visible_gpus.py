"""The NVIDIA GPUs a process sees, in the order CUDA numbers them, read through NVML.

CUDA_VISIBLE_DEVICES chooses them; NVML knows every GPU on the machine, by NVML index and UUID. The build
(build_scripts/environment.py), the trtllm backend (backends/trtllm_runtime.py), the memory ledger's GPU probe
(scheduler/ledger.py) and the benchmark's machine report all list GPUs here, so all see what CUDA will: `cuda_visible_order` applies the variable as CUDA does (a pure function of the variable and
the machine's GPU UUIDs), `list_visible_gpus` reads the machine through NVML (nvidia-ml-py, imported lazily).

How CUDA reads CUDA_VISIBLE_DEVICES (the CUDA C Programming Guide's environment variables, with the
repetition rule PyTorch's device count also follows):
  * unset: every GPU, in NVML's order (CUDA_DEVICE_ORDER=PCI_BUS_ID order; see below);
  * a comma-separated list, each entry a device index, a GPU UUID (`GPU-...`, or enough of its leading
    characters to name one GPU alone), or a MIG device UUID (`MIG-...`); CUDA numbers the devices 0, 1, ... in
    the list's order;
  * an index is read like C's strtoul: surrounding spaces ignored, the leading digits taken ("1gpu" is 1);
  * the first entry that names no device (no leading digit, as in "-1"; an index past the last GPU; a UUID
    prefix that matches no GPU, or more than one) ends the list: only the devices before it are visible;
  * a device named twice makes no device visible at all.
NVML numbers GPUs in PCI bus order; CUDA does too with CUDA_DEVICE_ORDER=PCI_BUS_ID, but by default orders the
fastest GPU first, so on a machine with different GPU models an index may name another GPU than NVML's index.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

NO_DRIVER_HINT = "is the NVIDIA driver installed (and, in a container, was it started with --gpus all)?"


@dataclass(frozen=True)
class Gpu:
    index: int  # as CUDA numbers it in the process (0, 1, ... in CUDA_VISIBLE_DEVICES' order)
    name: str  # "NVIDIA H100 80GB HBM3"
    major: int  # compute capability 9.0: major 9, minor 0
    minor: int
    memory_bytes: int = 0
    uuid: str = ""  # "GPU-..." (a MIG device's "MIG-...")

    @property
    def arch(self) -> str:
        return f"sm{self.major}{self.minor}"

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class GpuListing:
    gpus: tuple[Gpu, ...]
    problem: str | None = None  # why NVML could not list the GPUs (then `gpus` is empty)


def _entry_index(entry: str) -> int | None:
    """An index entry as strtoul reads it: its leading decimal digits; None if it has none."""
    digits = len(entry) - len(entry.lstrip("0123456789"))
    return int(entry[:digits]) if digits else None


def _resolve(entry: str, uuids: Sequence[str]) -> int | str | None:
    """The device one entry names: an NVML index, a MIG device UUID (NVML resolves it), or None."""
    if entry.startswith("MIG-"):
        return entry
    if entry.startswith("GPU-"):
        matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    index = _entry_index(entry)
    return index if index is not None and index < len(uuids) else None


def cuda_visible_order(visible: str | None, uuids: Sequence[str]) -> list[int | str]:
    """The devices CUDA numbers 0, 1, ... under CUDA_VISIBLE_DEVICES=`visible` (None: unset), on a machine whose
    GPUs have these UUIDs in NVML's order: each as its NVML index, or as a MIG device's UUID (whether that MIG
    device exists is NVML's to say). The rules are in this module's docstring."""
    if visible is None:
        return list(range(len(uuids)))
    devices: list[int | str] = []
    for entry in visible.split(","):
        device = _resolve(entry.strip(), uuids)
        if device is None:
            break
        if device in devices:
            return []
        devices.append(device)
    return devices


def list_visible_gpus(visible: str | None) -> GpuListing:
    """The GPUs CUDA_VISIBLE_DEVICES=`visible` (None: unset) leaves a process, in CUDA's order, through NVML.
    NVML that cannot be loaded or read gives no GPUs and the reason (`problem`). A MIG device NVML cannot find
    ends the list, as any entry that names no device does."""
    try:
        import pynvml
    except ImportError:
        return GpuListing((), "nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError: no driver library, no device node
        return GpuListing((), f"NVML: {exc}; {NO_DRIVER_HINT}")
    try:
        return GpuListing(tuple(_read_gpus(pynvml, visible)))
    except Exception as exc:  # an NVMLError while reading a GPU (e.g. what a MIG device cannot report)
        return GpuListing((), f"NVML: {exc}")
    finally:
        pynvml.nvmlShutdown()


def visible_handles(pynvml, visible: str | None) -> list[tuple[object, str]]:
    """(NVML handle, UUID) of each device CUDA_VISIBLE_DEVICES=`visible` leaves, in CUDA's order: the list's
    position is the CUDA index. NVML must be initialised; a MIG device NVML does not find ends the list."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(pynvml.nvmlDeviceGetCount())]
    uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    visible_devices = []
    for device in cuda_visible_order(visible, uuids):
        if isinstance(device, int):
            visible_devices.append((handles[device], uuids[device]))
            continue
        try:
            visible_devices.append((pynvml.nvmlDeviceGetHandleByUUID(device), device))
        except Exception as exc:  # pynvml.NVMLError_NotFound: the MIG device names nothing here
            log.debug("CUDA_VISIBLE_DEVICES names %s, which NVML does not find (%s): the list ends there",
                      device, exc)
            break
    return visible_devices


def _read_gpus(pynvml, visible: str | None) -> list[Gpu]:
    gpus = []
    for handle, uuid in visible_handles(pynvml, visible):
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        gpus.append(Gpu(len(gpus), _text(pynvml.nvmlDeviceGetName(handle)), major, minor, memory, uuid))
    return gpus


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
