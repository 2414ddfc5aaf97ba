"""What will be built: the user's options (`BuildOptions`) applied to a recipe and checked (`BuildSpec`).

Plain data, shared by the planners, preflight, the requirements estimate, the catalogue view and the manifest
(which records the command that rebuilds the engine). Of the build, it imports only the recipe and the catalogue's
RecipeError, so every other module can import it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from build_scripts.catalogue import RecipeError
from build_scripts.recipe import DTYPE_BYTES, FP8_MIN_SM, PORTABLE_BACKENDS, Quantization, Recipe

DEFAULT_EXAMPLES = Path("/app/tensorrt_llm/examples")  # where the official TensorRT-LLM container has them


@dataclass(frozen=True)
class BuildOptions:
    """What the user asked for on the command line (or through INFERNO_* variables, read by the CLI)."""

    engines_dir: Path = Path("engines")
    checkpoint: Path | None = None  # a local checkpoint folder; default: the recipe's source
    name: str | None = None  # engine folder name; default: the recipe name
    force: bool = False
    quant: str | None = None  # one of the recipe's quantisations; default: none (the recipe's dtype)
    tp: int | None = None  # tensor-parallel size; default: the recipe's
    arch: str | None = None  # target GPU architecture, e.g. sm90; default: the recipe's
    trtllm_examples: Path = DEFAULT_EXAMPLES  # TensorRT-LLM's examples/ folder (convert and quantize scripts)
    calib_dataset: str | None = None  # FP8 calibration data: a local folder on air-gapped sites
    hf_hub_cache: Path | None = None  # the Hugging Face cache to look for checkpoints in
    build_id: str = "0"  # distinguishes the temporary folders of concurrent builds (the CLI uses its pid)
    sim_gpu: str | None = None  # simulated engines: the GPU simulated; default h100-sxm
    sim_speedup: float | None = None  # simulated engines: how many times faster than the GPU; default 1
    sim_params: tuple[str, ...] = ()  # simulated engines: "NAME=VALUE" settings (build_scripts/sim_params.py)

    @property
    def sim_options(self) -> list[str]:
        """The simulator flags given, as they are spelled on the command line."""
        flags = [f"--sim-gpu {self.sim_gpu}"] if self.sim_gpu else []
        flags += [f"--sim-speedup {self.sim_speedup:g}"] if self.sim_speedup is not None else []
        return flags + [f"--sim-param {shlex.quote(param)}" for param in self.sim_params]


@dataclass(frozen=True)
class BuildSpec:
    """A recipe with the user's options applied and checked: exactly what will be built."""

    recipe: Recipe
    name: str
    quant: str | None
    tp_size: int
    pp_size: int
    arch: str

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def quantization(self) -> Quantization | None:
        return self.recipe.quantization[self.quant] if self.quant else None

    @property
    def weight_bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.quant or self.recipe.target.dtype]

    def summary(self) -> str:
        target, quant = self.recipe.target, self.quantization
        if target.backend == "sim":
            return f"sim: {target.engine_format}, {self.quant or 'bf16'} (simulated), TP {self.tp_size}, no GPU needed"
        precision = target.dtype
        if quant:
            parts = "weights and KV cache" if quant.kv_cache_dtype else "weights"
            precision = f"{self.quant} ({parts}), {target.dtype} elsewhere"
        where = {"trtllm": f"TP {self.tp_size} x PP {self.pp_size}, {self.arch}", "llamacpp": "llama.cpp on the CPU"}.get(
            target.backend, "any device")
        if target.backend == "llamacpp":
            converted = f"{target.gguf_type}, converted from the GGUF file"
            precision = converted if target.gguf_type else "the GGUF file's own quantisation"
        return f"{target.backend}: {target.engine_format}, {precision}, {where}"


def sim_precision(recipe: Recipe, asked: str | None) -> str | None:
    """A simulated engine's --quant: fp8 (the default, where the model has an FP8 build) or bf16 (None: the
    recipe's own 16-bit dtype, as for a TensorRT build without --quant)."""
    allowed = [*sorted(recipe.quantization), "bf16"]
    quant = asked or allowed[0]
    if quant not in allowed:
        raise RecipeError(f"{recipe.name} simulates {', '.join(allowed)}, not --quant {quant}")
    return None if quant == "bf16" else quant


def resolve_spec(recipe: Recipe, options: BuildOptions) -> BuildSpec:
    """Apply --quant, --tp, --arch, --name and the --sim-* options to a recipe, refusing what it does not allow."""
    sim = recipe.target.backend == "sim"
    if options.sim_options and not sim:
        raise RecipeError(f"{options.sim_options[0].split()[0]} applies to simulated engines (<model>-sim) only")
    if sim and options.arch:
        raise RecipeError(f"{recipe.name} is a simulated engine; choose its GPU with --sim-gpu, not --arch")
    quant = sim_precision(recipe, options.quant) if sim else options.quant
    allowed = sorted(recipe.quantization)
    if not sim and options.quant is not None and options.quant not in recipe.quantization:
        choices = ", ".join(allowed) if allowed else f"none ({recipe.name} builds only in {recipe.target.dtype})"
        raise RecipeError(f"{recipe.name} cannot be built with --quant {options.quant}; allowed: {choices}")
    tp = options.tp or recipe.parallel.tp_size
    if tp not in recipe.parallel.tp_choices:
        raise RecipeError(
            f"{recipe.name} cannot be built with --tp {tp}; allowed: {', '.join(map(str, recipe.parallel.tp_choices))}"
        )
    arch = options.arch or recipe.target.target_arch
    if recipe.target.backend in PORTABLE_BACKENDS and arch != "any":
        raise RecipeError(
            f"{recipe.name} builds a portable {recipe.target.backend} engine; --arch applies to TensorRT engines only")
    if recipe.target.backend == "trtllm" and (arch == "any" or not arch.startswith("sm") or not arch[2:].isdigit()):
        raise RecipeError(f"--arch {arch}: name a GPU architecture such as sm90 (Hopper) or sm89 (Ada)")
    if not sim and options.quant == "fp8" and int(arch[2:]) < FP8_MIN_SM:
        raise RecipeError(f"FP8 needs sm{FP8_MIN_SM} or newer (Ada, Hopper); --arch is {arch}")
    name = options.name or recipe.name
    if name.startswith(".") or "/" in name:
        raise RecipeError(f"--name {name!r}: an engine name is a plain folder name")
    return BuildSpec(recipe, name, quant, tp, recipe.parallel.pp_size, arch)


def rebuild_command(spec: BuildSpec, options: BuildOptions, checkpoint: Path | None = None) -> str:
    """The command a user runs to rebuild this engine; the server shows it when it refuses the engine.
    `checkpoint` is the folder given with --checkpoint, made absolute."""
    sim = spec.recipe.target.backend == "sim"
    parts = [f"make build-engine MODEL={spec.recipe.name}"]
    if spec.quant or sim:
        parts.append(f"QUANT={spec.quant or 'bf16'}")
    if options.tp:
        parts.append(f"TP={spec.tp_size}")
    extra = list(options.sim_options)
    if options.checkpoint:
        extra.append(f"--checkpoint {shlex.quote(str(checkpoint or options.checkpoint))}")
    if spec.name != spec.recipe.name:
        extra.append(f"--name {spec.name}")
    if options.arch:
        extra.append(f"--arch {spec.arch}")
    if extra:
        parts.append(shlex.quote("BUILD_ARGS=" + " ".join(extra)))
    return " ".join(parts)
