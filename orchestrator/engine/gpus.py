"""The GPUs a sim engine can be built for: memory as NVML reports it, and the rates the step-time model
scales with.

Only the H100 SXM is calibrated (sim-calibration.md). The H200 is the same GH100 chip (same SMs and clocks,
so the same compute) with more and faster memory: its step time is extrapolated from the H100's by memory
bandwidth (step_time.derive), which is first-order right for the bandwidth-bound terms and leaves the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class SimGpu:
    name: str
    description: str
    memory_bytes: int  # total, as NVML reports it
    bandwidth_bytes_s: float  # HBM bandwidth
    compute: float  # dense tensor throughput relative to the H100 SXM
    calibrated: bool  # the step-time parameters were fitted on this GPU
    # Pinned host RAM to GPU copies (a host KV tier's onboarding). Both GPUs sit on PCIe Gen5 x16: 64 GB/s a
    # direction raw (32 GT/s x 16 lanes, 128b/130b), about 55 GB/s measured for pinned copies by NVIDIA's
    # nvbandwidth (host_to_device_memcpy_ce, 55.6 GB/s in its published example run). sim-calibration.md has no
    # host-link figure; this one is [R] for the link and [I] for applying it to TensorRT-LLM's block copies,
    # which move whole blocks (2 MiB for Llama-3.1-8B FP8) and so run near the copy engine's rate.
    host_link_bytes_s: float = 55e9


GPUS: dict[str, SimGpu] = {
    gpu.name: gpu
    for gpu in (
        SimGpu("h100-sxm", "NVIDIA H100 80GB HBM3 (SXM)", 81_559 * MIB, 3.35e12, 1.0, calibrated=True),
        SimGpu("h200", "NVIDIA H200 141GB HBM3e (SXM)", 143_771 * MIB, 4.8e12, 1.0, calibrated=False),
    )
}
DEFAULT_GPU = "h100-sxm"
REFERENCE_GPU = GPUS["h100-sxm"]


def find_gpu(name: str) -> SimGpu:
    """A simulated GPU by name; ValueError naming the known ones."""
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"no simulated GPU named {name!r}; known: {', '.join(GPUS)}") from None
