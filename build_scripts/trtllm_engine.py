"""Planning and building TensorRT-LLM 1.2 engines: convert (or quantise), trtllm-build, tokenizer, manifest.

    1. convert_checkpoint.py (16-bit) or ModelOpt's quantize.py (FP8): Hugging Face checkpoint ->
       TensorRT-LLM checkpoint, sharded for TP, into a scratch folder
    2. trtllm-build: the engines (rank*.engine + config.json), into the staging folder
    3. the tokenizer files, copied from the checkpoint
    4. engine.json: the limits as trtllm-build recorded them, the world size checked against the plan's, the KV
       cache in the quantisation's type where it has one

Every flag comes from build_scripts/trtllm_flags.py. The plan is pure: it reads only its arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

from build_scripts.environment import Environment
from build_scripts.manifest_facts import (
    EngineOutputError,
    copy_tokenizer_step,
    kv_bytes_per_token,
    kv_cache_facts,
    model_facts,
    write_manifest,
)
from build_scripts.plan import BuildContext, BuildStep, Plan, engine_folders, new_plan
from build_scripts.sources import Checkpoint
from build_scripts.spec import BuildOptions, BuildSpec
from build_scripts.trtllm_flags import BUILD_TOOL, CONVERT_TOOL, QUANTIZE_TOOL, flags
from orchestrator.engine.manifest import Limits

CHECKPOINT_PLACEHOLDER = Path("<checkpoint>")


def convert_step(spec: BuildSpec, options: BuildOptions, python: str, source: Path, out: Path) -> BuildStep:
    script = options.trtllm_examples / spec.recipe.convert.script
    pairs = [
        ("--model_dir", source),
        ("--output_dir", out),
        ("--dtype", spec.recipe.target.dtype),
        ("--tp_size", spec.tp_size),
        ("--pp_size", spec.pp_size),
    ]
    description = f"convert the checkpoint to a {spec.recipe.target.dtype} TensorRT-LLM checkpoint, {spec.world_size} rank(s)"
    return BuildStep("convert", description, argv=(python, str(script), *flags(CONVERT_TOOL, pairs)), tool=CONVERT_TOOL)


def quantize_step(spec: BuildSpec, options: BuildOptions, python: str, source: Path, out: Path) -> BuildStep:
    quant = spec.quantization
    dataset = options.calib_dataset or quant.calib_dataset
    script = options.trtllm_examples / "quantization" / "quantize.py"
    pairs = [
        ("--model_dir", source),
        ("--output_dir", out),
        ("--dtype", spec.recipe.target.dtype),
        ("--qformat", quant.qformat),
        ("--calib_size", quant.calib_size),
        ("--calib_dataset", dataset),
        ("--tp_size", spec.tp_size),
    ]
    if quant.kv_cache_dtype:
        pairs.insert(4, ("--kv_cache_dtype", quant.kv_cache_dtype))
    where = "a local folder" if Path(dataset).is_absolute() else (
        "from the Hugging Face hub or its datasets cache; air-gapped sites pass --calib-dataset DIR")
    description = (f"quantise to {quant.qformat} with NVIDIA ModelOpt, calibrated on the GPU with "
                   f"{quant.calib_size} samples of {dataset} ({where})")
    return BuildStep("quantize", description, argv=(python, str(script), *flags(QUANTIZE_TOOL, pairs)), tool=QUANTIZE_TOOL)


def build_step(spec: BuildSpec, trtllm_build: str, checkpoint_dir: Path, out: Path) -> BuildStep:
    recipe, limits, plugins = spec.recipe, spec.recipe.limits, spec.recipe.plugins
    quant = spec.quantization
    gemm = quant.gemm_plugin if quant and quant.gemm_plugin else plugins.gemm_plugin
    pairs = [
        ("--checkpoint_dir", checkpoint_dir),
        ("--output_dir", out),
        ("--max_batch_size", limits.max_batch_size),
        ("--max_input_len", limits.max_input_len),
        ("--max_seq_len", limits.max_seq_len),
        ("--max_num_tokens", limits.max_num_tokens),
        ("--max_beam_width", 1),
        ("--kv_cache_type", "paged"),
        ("--tokens_per_block", recipe.kv_cache.tokens_per_block),
        ("--gpt_attention_plugin", plugins.gpt_attention_plugin),
        ("--gemm_plugin", gemm),
        ("--context_fmha", plugins.context_fmha),
        ("--use_paged_context_fmha", plugins.use_paged_context_fmha),
        ("--use_fp8_context_fmha", plugins.use_fp8_context_fmha and spec.quant == "fp8"),
        ("--remove_input_padding", plugins.remove_input_padding),
        ("--use_fused_mlp", plugins.use_fused_mlp),
        ("--multiple_profiles", plugins.multiple_profiles),
        ("--workers", spec.world_size),
    ]
    argv = (trtllm_build, *flags(BUILD_TOOL, pairs))
    return BuildStep("build", f"compile {spec.world_size} TensorRT engine(s) for {spec.arch}", argv=argv, tool=BUILD_TOOL)


def plan_trtllm(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Environment) -> Plan:
    folders = engine_folders(spec, options)
    source = checkpoint.path or CHECKPOINT_PLACEHOLDER
    converted = folders.scratch / "trtllm-checkpoint"
    first = (quantize_step if spec.quant else convert_step)(spec, options, env.python, source, converted)
    steps = (
        first,
        build_step(spec, env.trtllm_build or "trtllm-build", converted, folders.staging),
        copy_tokenizer_step(source),
        BuildStep("manifest", "write engine.json (limits, versions, GPU, fingerprint)", action=write_trtllm_manifest),
    )
    calib_dataset = (options.calib_dataset or spec.quantization.calib_dataset) if spec.quant else None
    build = {"quant": spec.quant, "tp": spec.tp_size, "pp": spec.pp_size, "calib_dataset": calib_dataset}
    return new_plan(spec, options, checkpoint, env, steps, scratch=True, inputs={"build": build})


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


def write_trtllm_manifest(ctx: BuildContext) -> None:
    plan, folder = ctx.plan, ctx.workdir
    spec, recipe = plan.spec, plan.recipe
    engine_config = check_build_output(folder, spec.world_size)
    hf_config = json.loads((plan.checkpoint.path / "config.json").read_text())
    quant = spec.quantization
    kv_dtype = quant.kv_cache_dtype if quant and quant.kv_cache_dtype else recipe.target.dtype
    write_manifest(
        ctx,
        model=model_facts(plan, hf_config),
        kv_cache=kv_cache_facts(plan, kv_bytes_per_token(hf_config, kv_dtype),
                                dtype=kv_dtype if kv_dtype != recipe.target.dtype else None),
        weights_bytes=sum(path.stat().st_size for path in folder.glob("rank*.engine")),
        limits=engine_limits(engine_config, recipe.limits),
    )
