"""Finding TensorRT-LLM, and deciding whether an engine folder can run with it on this machine's GPUs.

Imported only inside a worker process whose engine says `"backend": "trtllm"`. TensorRT-LLM is imported
here, lazily, so a server without it starts and serves its other models; this model's load fails with
`BackendUnavailable` saying what to install.

A TensorRT engine is a plan for one GPU architecture built by one TensorRT-LLM version. The manifest
records both (`build.target_arch`, `build.compute_capability`, `build.tools["tensorrt_llm"]`); an engine
that disagrees with the running version or GPUs is refused before any weights are read, naming the rebuild
command.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from orchestrator.engine import trtllm_release as release
from orchestrator.engine.manifest import EngineManifest, EngineRefused
from orchestrator.errors import BackendUnavailable, ModelUnavailable
from orchestrator.visible_gpus import Gpu, list_visible_gpus

log = logging.getLogger(__name__)

SUPPORTED_LINE, PINNED_VERSION = release.LINE, release.VERSION


@dataclass(frozen=True)
class Runtime:
    """The TensorRT-LLM this worker drives."""

    bindings: ModuleType  # tensorrt_llm.bindings.executor
    version: str  # tensorrt_llm.__version__
    package_dir: Path  # where tensorrt_llm is installed; bin/executorWorker lives under it

    @property
    def worker_executable(self) -> Path:
        return self.package_dir / "bin" / "executorWorker"


def load_runtime() -> Runtime:
    """Import TensorRT-LLM 1.2.x; raise BackendUnavailable naming the version and where to get it."""
    try:
        import tensorrt_llm
        from tensorrt_llm.bindings import executor
    except (ImportError, OSError) as exc:  # OSError: the package is there but a shared library is not
        raise BackendUnavailable(
            f"the trtllm backend needs TensorRT-LLM {PINNED_VERSION}, which cannot be imported here "
            f"({type(exc).__name__}: {exc}); {release.INSTALL_HINT}"
        ) from exc
    version = str(tensorrt_llm.__version__)
    if not version.startswith(SUPPORTED_LINE):
        raise BackendUnavailable(
            f"the trtllm backend needs TensorRT-LLM {SUPPORTED_LINE}x ({PINNED_VERSION}), but {version} is "
            f"installed; later lines removed the TensorRT engine path. {release.INSTALL_HINT}"
        )
    return Runtime(bindings=executor, version=version, package_dir=Path(tensorrt_llm.__file__).parent)


def check_engine_matches_runtime(
    manifest: EngineManifest, folder: Path, runtime_version: str, gpus: list[Gpu] | None
) -> None:
    """Refuse (ModelUnavailable naming the rebuild command) an engine built for another version or GPU.

    `gpus` is None when the GPUs cannot be inspected here (no NVIDIA driver library); the architecture
    check is then left to TensorRT, which refuses a plan built for another GPU when it deserialises it.
    """
    built_with = manifest.build.tools.get("tensorrt_llm")
    if built_with is None:
        _refuse(folder, "the manifest does not record which TensorRT-LLM version built this engine")
    if built_with != runtime_version:
        _refuse(folder, f"built with TensorRT-LLM {built_with}, but this server runs TensorRT-LLM {runtime_version}")
    if gpus is None:
        log.warning("cannot inspect the GPUs here (no NVML); leaving the GPU architecture check to TensorRT")
        return
    needed = manifest.parallel.world_size
    if len(gpus) < needed:
        _refuse(folder, f"needs {needed} GPU(s) (tp {manifest.parallel.tp_size} x pp {manifest.parallel.pp_size}), "
                        f"but {len(gpus)} visible")
    for gpu in gpus[:needed]:
        if not _same_arch(manifest, gpu):
            _refuse(
                folder,
                f"built for {manifest.build.target_arch} (compute capability "
                f"{manifest.build.compute_capability or 'unknown'}), but GPU {gpu.index} ({gpu.name}) is "
                f"{gpu.arch} (compute capability {gpu.compute_capability})",
            )


def _same_arch(manifest: EngineManifest, gpu: Gpu) -> bool:
    wanted = manifest.build.compute_capability
    if wanted is not None:
        return wanted == gpu.compute_capability
    match = re.fullmatch(r"sm_?(\d+)[a-z]?", manifest.build.target_arch)
    return match is not None and match.group(1) == gpu.arch[2:]


def _refuse(folder: Path, reason: str):
    raise ModelUnavailable(str(EngineRefused(folder, reason)))


def visible_gpus() -> list[Gpu] | None:
    """The GPUs CUDA will number 0, 1, ... in this process (its CUDA_VISIBLE_DEVICES, which the Executor
    follows), read through NVML; None if NVML is unusable here."""
    listing = list_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if listing.problem is not None:
        log.warning("cannot read the GPUs through NVML (%s)", listing.problem)
        return None
    return list(listing.gpus)
