"""Planning and building portable `hf` engines: safetensors weights, tokenizer, chat template, generation
config and manifest, loadable by transformers in well under a second."""

from __future__ import annotations

import json
from pathlib import Path

from build_scripts.environment import Environment
from build_scripts.manifest_facts import (
    copy_tokenizer,
    kv_bytes_per_token,
    kv_cache_facts,
    model_facts,
    write_manifest,
)
from build_scripts.plan import BuildContext, BuildStep, Plan, new_plan
from build_scripts.sources import Checkpoint
from build_scripts.spec import BuildOptions, BuildSpec
from orchestrator.engine.manifest import MANIFEST_FILE


def plan_hf(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Environment) -> Plan:
    source = checkpoint.path or Path("<checkpoint>")
    is_gguf = source.suffix == ".gguf"
    convert = BuildStep(
        "convert",
        f"{'dequantise' if is_gguf else 'convert'} {source.name} to {spec.recipe.target.dtype} safetensors "
        f"with its tokenizer, chat template and generation config",
        action=convert_gguf if is_gguf else convert_checkpoint,
    )
    manifest = BuildStep("manifest", f"write {MANIFEST_FILE}", action=write_hf_manifest)
    return new_plan(spec, options, checkpoint, env, (convert, manifest))


def _generation_config(ctx: BuildContext, eos_token_id, bos_token_id, pad_token_id):
    from transformers import GenerationConfig

    defaults = ctx.plan.recipe.generation_defaults
    return GenerationConfig(
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        do_sample=defaults.temperature > 0,
        temperature=defaults.temperature,
        top_p=defaults.top_p,
        top_k=defaults.top_k or None,
    )


def convert_gguf(ctx: BuildContext) -> None:
    """transformers dequantises GGUF on load (~15 s) but refuses to save such a model; a fresh model made from
    its config, with the state dict loaded into it, saves to safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, out = ctx.plan.checkpoint.path, ctx.workdir
    dtype = getattr(torch, ctx.plan.recipe.target.dtype)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    _generation_config(ctx, tokenizer.eos_token_id, tokenizer.bos_token_id, pad).save_pretrained(out)


def convert_checkpoint(ctx: BuildContext) -> None:
    """A Hugging Face checkpoint folder: weights re-saved in the recipe's dtype, tokenizer files copied."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, out = ctx.plan.checkpoint.path, ctx.workdir
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, ctx.plan.recipe.target.dtype))
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.save_pretrained(out)
    copy_tokenizer(source, out)
    eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    _generation_config(ctx, eos, tokenizer.bos_token_id, pad).save_pretrained(out)


def write_hf_manifest(ctx: BuildContext) -> None:
    plan, folder = ctx.plan, ctx.workdir
    config = json.loads((folder / "config.json").read_text())
    write_manifest(
        ctx,
        model=model_facts(plan, config),
        kv_cache=kv_cache_facts(plan, kv_bytes_per_token(config, plan.recipe.target.dtype)),
        weights_bytes=sum(p.stat().st_size for p in folder.glob("*.safetensors")),
    )
