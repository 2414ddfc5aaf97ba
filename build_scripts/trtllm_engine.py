"""The in-process steps of a TensorRT-LLM engine build: copy the tokenizer, write the manifest.

They run after trtllm-build has written config.json and rank*.engine into the staging folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from build_scripts.manifest_facts import (
    build_info,
    copy_tokenizer,
    kv_bytes_per_token,
    model_facts,
    tokenizer_facts,
)
from build_scripts.plan import BuildContext, Step
from build_scripts.sources import TOKENIZER_FILES
from orchestrator.engine.manifest import (
    MANIFEST_FILE,
    EngineManifest,
    KvCacheFacts,
    Limits,
    Parallelism,
)


class EngineOutputError(Exception):
    """trtllm-build finished but its output is not the engine the plan asked for."""


def copy_tokenizer_step(source: Path) -> Step:
    def action(ctx: BuildContext) -> None:
        copied = copy_tokenizer(ctx.plan.checkpoint.path, ctx.workdir)
        if "tokenizer.json" not in copied:
            raise EngineOutputError(f"{ctx.plan.checkpoint.path} has no tokenizer.json to ship with the engine")
        print(f"copied {', '.join(copied)}")

    names = ", ".join(name for name in TOKENIZER_FILES if name != "tokenizer.model")
    return Step("tokenizer", f"copy {names} (those present) from {source}", action=action)


def engine_limits(engine_config: dict, planned: Limits) -> Limits:
    """The limits trtllm-build recorded in the engine's config.json (the planned ones where absent)."""
    built = engine_config.get("build_config") or {}
    values = {key: built.get(key) or getattr(planned, key) for key in Limits.model_fields}
    return Limits(**values)


def check_build_output(folder: Path, world_size: int) -> dict:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise EngineOutputError(f"trtllm-build wrote no config.json into {folder}")
    config = json.loads(config_path.read_text())
    missing = [f"rank{rank}.engine" for rank in range(world_size) if not (folder / f"rank{rank}.engine").is_file()]
    if missing:
        raise EngineOutputError(f"trtllm-build did not write {', '.join(missing)} into {folder}")
    mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
    if mapping.get("world_size", world_size) != world_size:
        raise EngineOutputError(f"the engine's world size is {mapping['world_size']}, the plan's {world_size}")
    return config


def write_manifest(ctx: BuildContext) -> None:
    plan, folder = ctx.plan, ctx.workdir
    spec, recipe = plan.spec, plan.recipe
    engine_config = check_build_output(folder, spec.world_size)
    hf_config = json.loads((plan.checkpoint.path / "config.json").read_text())
    quant = spec.quantization
    kv_dtype = quant.kv_cache_dtype if quant and quant.kv_cache_dtype else recipe.target.dtype
    manifest = EngineManifest(
        name=plan.name,
        backend="trtllm",
        format="trt-engine",
        model=model_facts(ctx, hf_config),
        dtype=recipe.target.dtype,
        quantization=spec.quant,
        limits=engine_limits(engine_config, recipe.limits),
        parallel=Parallelism(tp_size=spec.tp_size, pp_size=spec.pp_size),
        tokenizer=tokenizer_facts(folder),
        kv_cache=KvCacheFacts(
            tokens_per_block=recipe.kv_cache.tokens_per_block,
            bytes_per_token=kv_bytes_per_token(hf_config, kv_dtype),
            default_budget_bytes=recipe.kv_cache.default_budget_bytes * spec.world_size,
            dtype=kv_dtype if kv_dtype != recipe.target.dtype else None,
        ),
        weights_bytes=sum(path.stat().st_size for path in folder.glob("rank*.engine")),
        generation_defaults=recipe.generation_defaults,
        chat=recipe.chat,
        build=build_info(ctx),
    )
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
