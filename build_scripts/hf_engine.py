"""Planning and building portable `hf` engines: safetensors weights, tokenizer, chat template, generation
config and manifest, loadable by transformers in well under a second."""

from __future__ import annotations

import json
from pathlib import Path

from build_scripts.environment import Environment
from build_scripts.manifest_facts import (
    build_info,
    copy_tokenizer,
    kv_bytes_per_token,
    model_facts,
    tokenizer_facts,
)
from build_scripts.plan import BuildContext, Plan, Step, staging_paths
from build_scripts.sources import Checkpoint
from build_scripts.spec import BuildOptions, BuildSpec
from orchestrator.engine.manifest import (
    MANIFEST_FILE,
    EngineManifest,
    KvCacheFacts,
)


def plan_hf(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Environment) -> Plan:
    recipe = spec.recipe
    output = options.engines_dir.absolute() / spec.name
    staging, _ = staging_paths(output, options.build_id)
    source = checkpoint.path or Path("<checkpoint>")
    inputs = {
        "recipe": recipe.model_dump(mode="json"),
        "source": checkpoint.identity,
        "tools": env.tools,
        "target_arch": "any",
    }
    is_gguf = source.suffix == ".gguf"
    convert = Step(
        "convert",
        f"{'dequantise' if is_gguf else 'convert'} {source.name} to {recipe.target.dtype} safetensors "
        f"with its tokenizer, chat template and generation config",
        action=convert_gguf if is_gguf else convert_checkpoint,
    )
    manifest = Step("manifest", f"write {MANIFEST_FILE}", action=write_manifest)
    return Plan(
        spec=spec,
        options=options,
        checkpoint=checkpoint,
        output=output,
        staging=staging,
        scratch=None,
        inputs=inputs,
        gpu=None,
        steps=(convert, manifest),
        environment=env,
    )


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


def write_manifest(ctx: BuildContext) -> None:
    plan, folder = ctx.plan, ctx.workdir
    recipe = plan.recipe
    config = json.loads((folder / "config.json").read_text())
    manifest = EngineManifest(
        name=plan.name,
        backend="hf",
        format="hf-safetensors",
        model=model_facts(ctx, config),
        dtype=recipe.target.dtype,
        limits=recipe.limits,
        tokenizer=tokenizer_facts(folder),
        kv_cache=KvCacheFacts(
            tokens_per_block=recipe.kv_cache.tokens_per_block,
            bytes_per_token=kv_bytes_per_token(config, recipe.target.dtype),
            default_budget_bytes=recipe.kv_cache.default_budget_bytes,
        ),
        weights_bytes=sum(p.stat().st_size for p in folder.glob("*.safetensors")),
        generation_defaults=recipe.generation_defaults,
        chat=recipe.chat,
        build=build_info(ctx),
    )
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
