"""CUDA_VISIBLE_DEVICES as CUDA applies it (orchestrator/visible_gpus.py), on values as people write them and UUIDs
as nvidia-smi prints them; and the NVML walk, on a stand-in for nvidia-ml-py (there is no NVIDIA driver here)."""

from __future__ import annotations

import sys

import pytest

from build_scripts.environment import list_gpus
from orchestrator.bench.report import machine
from orchestrator.scheduler.ledger import HostProbe, NvmlProbe, detect_probe
from orchestrator.visible_gpus import Gpu, cuda_visible_order, list_visible_gpus
from tests.fakes.nvml import FakeGpu, FakeNvml

# Four GPUs by NVML index, as `nvidia-smi -L` lists them; the last two share their first eight hex digits.
UUIDS = [
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-1b5ac7a3-5a1e-fbd8-9be1-51b1bc4c4f2d",
    "GPU-e2c4f6a0-0f34-4f2c-a3a1-5f0b4c7d2e11",
    "GPU-e2c4f6a0-77b1-09d2-c6e4-a1d0e3f90b42",
]
MIG = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"


@pytest.mark.parametrize(("visible", "order"), [
    (None, [0, 1, 2, 3]),  # unset: every GPU, in NVML's order
    ("2,1", [2, 1]),  # CUDA numbers them in the list's order
    ("0,2,-1,1", [0, 2]),  # the CUDA C Programming Guide's example: the list ends at the first invalid entry
    ("-1", []),  # the usual way to hide every GPU
    ("", []),
    ("1, 3", [1, 3]),  # spaces around an entry are ignored
    (" 3 ,0", [3, 0]),
    ("1gpu,2", [1, 2]),  # an index is read like strtoul: its leading digits
    ("1,4,0", [1]),  # an index past the last GPU ends the list
    ("0,,1", [0]),  # so does an empty entry
    ("1,0,1", []),  # a device named twice: no device at all
    ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", [0]),  # a whole UUID
    ("GPU-1b5ac7a3,GPU-8932", [1, 0]),  # enough of a UUID to name one GPU alone
    ("GPU-e2c4f6a0,0", []),  # a prefix two GPUs share names none, and ends the list there
    ("GPU-e2c4f6a0-77b1,GPU-e2c4f6a0-0f34", [3, 2]),
    ("GPU-1b5ac7a3,1", []),  # the same GPU by UUID and by index
    ("GPU-00000000,0", []),  # a UUID no GPU has ends the list
    ("GPU-8932f937,2", [0, 2]),  # UUIDs and indices, each entry read on its own
    (f"{MIG},0", [MIG, 0]),  # a MIG device: NVML says whether it exists
    (f"{MIG},{MIG}", []),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible, order):
    assert cuda_visible_order(visible, UUIDS) == order


def test_a_machine_without_gpus_sees_none_whatever_the_variable_says():
    assert cuda_visible_order(None, []) == [] and cuda_visible_order("0", []) == []


NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA L40S"]
CAPABILITIES = [(9, 0), (8, 0), (8, 9), (8, 9)]


@pytest.fixture
def nvml(monkeypatch) -> FakeNvml:
    machine = [FakeGpu(uuid, name, cc, (80 if i < 2 else 48) * 2**30)
               for i, (uuid, name, cc) in enumerate(zip(UUIDS, NAMES, CAPABILITIES, strict=True))]
    fake = FakeNvml(machine, mig_devices=(FakeGpu(MIG, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", (9, 0), 40 * 2**30),))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_nvml_lists_the_visible_gpus_numbered_as_cuda_numbers_them(nvml):
    listing = list_visible_gpus("GPU-e2c4f6a0-77b1,1")
    assert listing.problem is None and nvml.open is False
    assert listing.gpus == (Gpu(0, "NVIDIA L40S", 8, 9, 48 * 2**30, UUIDS[3]),
                            Gpu(1, "NVIDIA A100-SXM4-80GB", 8, 0, 80 * 2**30, UUIDS[1]))
    assert [(gpu.arch, gpu.compute_capability) for gpu in listing.gpus] == [("sm89", "8.9"), ("sm80", "8.0")]


def test_a_mig_device_is_found_by_its_uuid_and_one_nvml_does_not_know_ends_the_list(nvml):
    [mig] = list_visible_gpus(f"{MIG}").gpus
    assert (mig.index, mig.uuid, mig.memory_bytes, mig.arch) == (0, MIG, 40 * 2**30, "sm90")
    unknown = "MIG-00000000-0000-0000-0000-000000000000"
    assert [gpu.uuid for gpu in list_visible_gpus(f"0,{unknown},1").gpus] == [UUIDS[0]]


def test_the_build_sees_the_gpus_the_server_would(nvml):
    gpus, problem = list_gpus("2,0")
    assert problem is None and [gpu.name for gpu in gpus] == ["NVIDIA L40S", "NVIDIA H100 80GB HBM3"]
    assert list_gpus("-1") == ((), "NVML lists no visible NVIDIA GPU")


def test_without_nvml_there_are_no_gpus_and_the_reason_says_why(monkeypatch, nvml):
    def no_driver():
        raise nvml.NVMLError("NVML Shared Library Not Found")

    monkeypatch.setattr(nvml, "nvmlInit", no_driver)
    listing = list_visible_gpus(None)
    assert listing.gpus == () and "NVML Shared Library Not Found; is the NVIDIA driver installed" in listing.problem
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the module itself is missing
    assert list_visible_gpus("0") == list_visible_gpus(None)
    assert list_visible_gpus("0").problem == "nvidia-ml-py is not installed"


def test_the_memory_ledger_probes_the_gpu_cuda_numbers_with_its_index(nvml, monkeypatch):
    """--memory.gpu-index counts as CUDA does: the first GPU CUDA_VISIBLE_DEVICES names is index 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-e2c4f6a0-77b1,1")
    first, second = detect_probe("auto", 0), detect_probe("auto", 1)
    assert isinstance(first, NvmlProbe) and first.read().total_bytes == 48 * 2**30  # the L40S, NVML's 3
    assert isinstance(second, NvmlProbe) and second.read().total_bytes == 80 * 2**30  # the A100, NVML's 1
    assert isinstance(detect_probe("auto", 2), HostProbe)  # CUDA sees two GPUs here
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert detect_probe("auto", 3).read().total_bytes == 48 * 2**30


def test_a_benchmark_names_the_gpus_in_cudas_order(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert machine()["gpus"] == ["NVIDIA L40S", "NVIDIA H100 80GB HBM3"]
