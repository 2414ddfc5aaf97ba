"""What a build needs from the machine, estimated from the recipe alone (no checkpoint, no GPU needed).

Shared by preflight (which compares it with the machine) and `inferno models catalogue` (which lists it).
"""

from __future__ import annotations

from dataclasses import dataclass

from build_scripts.spec import BuildSpec
from orchestrator.engine import trtllm_release as release

REQUIRED_TRTLLM = release.VERSION  # the version the planner's flags were checked against
TRTLLM_LINE = release.LINE  # any 1.2.x release has the TensorRT engine path and these flags
TRTLLM_CONTAINER = release.CONTAINER
DISK_MARGIN = 1.25  # temporary files and the log on top of the estimate
SIM_DISK_BYTES = 50 * 10**6  # a tokenizer and two JSON files
GGUF_BYTES_PER_PARAM = 1.07  # Q8_0, the largest common GGUF quantisation (the file is linked, or copied once)
GGUF_TYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}  # a recipe's target.gguf_type: the file written at build time
ARCH_NAMES = {"sm80": "Ampere (A100)", "sm86": "Ampere", "sm89": "Ada (L4, L40S)", "sm90": "Hopper (H100, H200)",
              "sm100": "Blackwell (B200)", "sm120": "Blackwell"}


@dataclass(frozen=True)
class Requirements:
    gpus: int  # 0: runs anywhere
    arch: str
    disk_bytes: int  # peak disk use under the engines folder
    weights_per_gpu_bytes: int  # GPU memory the weights take on each GPU at serving time
    tools: str  # what must be installed


def arch_name(arch: str) -> str:
    return f"{arch} {ARCH_NAMES[arch]}" if arch in ARCH_NAMES else arch


def requirements(spec: BuildSpec) -> Requirements:
    if spec.recipe.target.backend == "llamacpp":  # the GGUF file as it is (up to Q8_0's 8.5 bits), or converted
        gguf_type = spec.recipe.target.gguf_type
        weights = int(spec.recipe.parameters * (GGUF_TYPE_BYTES[gguf_type] if gguf_type else GGUF_BYTES_PER_PARAM))
        return Requirements(0, "any", int(weights * DISK_MARGIN), weights, "llama-cpp-python (pip install -e '.[llamacpp]')")
    weights = int(spec.recipe.parameters * spec.weight_bytes_per_param)
    if spec.recipe.target.backend == "sim":  # the weights are simulated: nothing of them is on disk or a GPU
        return Requirements(0, "any", SIM_DISK_BYTES, 0, "tokenizers (transformers and gguf for a stand-in tokenizer)")
    if spec.recipe.target.backend == "hf":
        return Requirements(0, "any", int(weights * DISK_MARGIN), weights, "torch, transformers (pip install -e '.[hf]')")
    # A converted (or quantised) TensorRT-LLM checkpoint and the engine built from it exist together at the end.
    return Requirements(
        gpus=spec.world_size,
        arch=spec.arch,
        disk_bytes=int(2 * weights * DISK_MARGIN),
        weights_per_gpu_bytes=weights // spec.world_size,
        tools=f"TensorRT-LLM {REQUIRED_TRTLLM}",
    )
