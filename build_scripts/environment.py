"""What the build machine has: tool versions, NVIDIA GPUs (orchestrator/visible_gpus.py: NVML, in CUDA's order
under CUDA_VISIBLE_DEVICES), free disk.

This is the one place the build looks at the machine; planning and preflight only read the
`Environment` it returns, so they can be checked against any machine described as plain data.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.visible_gpus import Gpu, list_visible_gpus

MISSING = "missing"
# Manifest key -> the distributions that may provide it (the first installed one wins).
HF_TOOLS = {name: (name,) for name in ("transformers", "torch", "safetensors", "gguf", "tokenizers")}
SIM_TOOLS = {name: (name,) for name in ("tokenizers", "transformers", "gguf")}  # the last two: a stand-in tokenizer
LLAMACPP_TOOLS = {name: (name.replace("_", "-"),) for name in ("llama_cpp_python", "gguf", "transformers", "tokenizers")}
TRTLLM_TOOLS = {
    "tensorrt_llm": ("tensorrt_llm",),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"),
    "modelopt": ("nvidia-modelopt",),
    "torch": ("torch",),
    "transformers": ("transformers",),
}


@dataclass(frozen=True)
class Environment:
    tools: dict[str, str]  # manifest key -> version, MISSING when not installed
    python: str  # the interpreter that runs TensorRT-LLM's scripts (this one)
    free_disk_bytes: int
    gpus: tuple[Gpu, ...] = ()
    gpu_problem: str | None = None  # why no GPU could be listed
    trtllm_build: str | None = None  # the trtllm-build executable, if found
    cache_free_disk_bytes: int | None = None  # free bytes where the Hugging Face cache is (None: not probed)
    cache_shares_disk: bool = False  # the cache and the engines folder are on one filesystem


def tool_versions(tools: dict[str, tuple[str, ...]]) -> dict[str, str]:
    versions = {}
    for key, distributions in tools.items():
        versions[key] = MISSING
        for distribution in distributions:
            try:
                versions[key] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def _existing(folder: Path) -> Path:
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    return existing


def free_disk(folder: Path) -> int:
    """Free bytes on the filesystem that holds `folder` (or would, once created)."""
    return shutil.disk_usage(_existing(folder)).free


def cache_disk(cache: Path | None, engines_dir: Path) -> dict:
    """The Environment fields that say where a fetched checkpoint goes: free bytes there, and whether the engines
    folder is on the same filesystem (then the two share that space)."""
    if cache is None:
        return {}
    return {"cache_free_disk_bytes": free_disk(cache),
            "cache_shares_disk": _existing(cache).stat().st_dev == _existing(engines_dir).stat().st_dev}


def list_gpus(visible: str | None = None) -> tuple[tuple[Gpu, ...], str | None]:
    """NVIDIA GPUs as CUDA will number them under CUDA_VISIBLE_DEVICES=`visible`, and why there are none."""
    listing = list_visible_gpus(visible)
    if listing.problem is not None:
        return (), listing.problem
    return listing.gpus, None if listing.gpus else "NVML lists no visible NVIDIA GPU"


def find_trtllm_build() -> str | None:
    beside = Path(sys.executable).parent / "trtllm-build"
    return str(beside) if beside.is_file() else shutil.which("trtllm-build")


def probe(backend: str, engines_dir: Path, visible_devices: str | None = None, cache: Path | None = None) -> Environment:
    """The machine as the build sees it; GPUs are listed only for TensorRT builds (a sim engine needs none), the
    disk where the Hugging Face cache is only for a build that fetches into it (`cache`)."""
    if backend in ("hf", "sim", "llamacpp"):
        tools = {"hf": HF_TOOLS, "sim": SIM_TOOLS, "llamacpp": LLAMACPP_TOOLS}[backend]
        return Environment(tool_versions(tools), sys.executable, free_disk(engines_dir), **cache_disk(cache, engines_dir))
    gpus, problem = list_gpus(visible_devices)
    return Environment(
        tools=tool_versions(TRTLLM_TOOLS),
        python=sys.executable,
        free_disk_bytes=free_disk(engines_dir),
        gpus=gpus,
        gpu_problem=problem,
        trtllm_build=find_trtllm_build(),
        **cache_disk(cache, engines_dir),
    )
