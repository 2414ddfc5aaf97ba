"""The engine manifest every planner writes last, and the facts it records, read from the files a build produced.

`write_manifest` fills in what every engine records alike (name, backend, format, dtype, quantisation, limits,
parallelism, tokenizer, sampling defaults, chat format, build info); each backend passes what is its own: the
model facts, the KV cache geometry, the weights' size and anything it records otherwise.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from build_scripts.plan import BuildContext, BuildStep, Plan
from build_scripts.recipe import DTYPE_BYTES
from build_scripts.sources import TOKENIZER_FILES
from build_scripts.spec import rebuild_command
from orchestrator.engine.manifest import (
    MANIFEST_FILE,
    BuildInfo,
    EngineManifest,
    KvCacheFacts,
    ModelFacts,
    Parallelism,
    TokenizerFacts,
)


class EngineOutputError(Exception):
    """A step finished but the engine folder lacks what the plan asked of it."""


def copy_tokenizer(source: Path, target: Path) -> list[str]:
    """Copy the tokenizer files a checkpoint folder has; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and not (target / name).exists():
            shutil.copyfile(source / name, target / name)
            copied.append(name)
    return copied


def copy_tokenizer_step(source: Path) -> BuildStep:
    """The step that ships the checkpoint's tokenizer files with the engine (tokenizer.json at least)."""

    def action(ctx: BuildContext) -> None:
        copied = copy_tokenizer(ctx.plan.checkpoint.path, ctx.workdir)
        if "tokenizer.json" not in copied:
            raise EngineOutputError(f"{ctx.plan.checkpoint.path} has no tokenizer.json to ship with the engine")
        print(f"copied {', '.join(copied)}")

    names = ", ".join(name for name in TOKENIZER_FILES if name != "tokenizer.model")
    return BuildStep("tokenizer", f"copy {names} (those present) from {source}", action=action)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _eos_from_tokenizer(folder: Path, tokenizer_config: dict) -> int | None:
    from tokenizers import Tokenizer

    eos = tokenizer_config.get("eos_token")
    text = eos.get("content") if isinstance(eos, dict) else eos
    if not text or not (folder / "tokenizer.json").is_file():
        return None
    return Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(text)


def tokenizer_facts(folder: Path) -> TokenizerFacts:
    """End, pad and begin tokens from generation_config.json (else tokenizer_config.json), and the chat template."""
    generation = _read_json(folder / "generation_config.json")
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    eos = generation.get("eos_token_id")
    if eos is None:
        eos = _eos_from_tokenizer(folder, tokenizer_config)
    if eos is None:
        raise ValueError(f"{folder}: no end-of-sequence token in generation_config.json or tokenizer_config.json")
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    has_template = (folder / "chat_template.jinja").is_file() or isinstance(tokenizer_config.get("chat_template"), str)
    pad = generation.get("pad_token_id")
    return TokenizerFacts(
        eos_token_ids=eos_ids,
        pad_token_id=eos_ids[0] if pad is None else pad,
        bos_token_id=generation.get("bos_token_id"),
        has_chat_template=has_template,
    )


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """K and V of every layer for one token of one sequence, from a Hugging Face config.json."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


def kv_cache_facts(plan: Plan, bytes_per_token: int, dtype: str | None = None) -> KvCacheFacts:
    """The recipe's KV cache geometry, its default budget per GPU times the GPUs, and the bytes of one token as built
    (`dtype`: where the cache is stored in another type than the model's)."""
    kv_cache = plan.recipe.kv_cache
    return KvCacheFacts(
        tokens_per_block=kv_cache.tokens_per_block,
        bytes_per_token=bytes_per_token,
        default_budget_bytes=kv_cache.default_budget_bytes * plan.spec.world_size,
        dtype=dtype,
    )


def build_info(ctx: BuildContext) -> BuildInfo:
    plan = ctx.plan
    gpu = plan.gpu
    return BuildInfo(
        fingerprint=plan.fingerprint or "unknown",
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
        duration_s=round(time.monotonic() - ctx.started_at, 3),
        tools=plan.tools,
        target_arch=plan.target_arch,
        gpu_name=gpu.name if gpu else None,
        compute_capability=gpu.compute_capability if gpu else None,
        rebuild=rebuild_command(plan.spec, plan.options, plan.checkpoint.path),
        steps=tuple(step.render() for step in plan.steps),
    )


def model_facts(plan: Plan, hf_config: dict | None = None, *, source: str | None = None,
                parameters: int | None = None) -> ModelFacts:
    """What the engine was built from: the recipe, the architecture the checkpoint declares (else the recipe's), the
    checkpoint's path and the recipe's parameter count, unless `source` or `parameters` say otherwise."""
    recipe = plan.recipe
    return ModelFacts(
        recipe=recipe.name,
        architecture=((hf_config or {}).get("architectures") or [recipe.architecture])[0],
        source=str(plan.checkpoint.path) if source is None else source,
        parameters=recipe.parameters if parameters is None else parameters,
    )


def write_manifest(ctx: BuildContext, *, model: ModelFacts, kv_cache: KvCacheFacts, weights_bytes: int,
                   **particular) -> None:
    """Write engine.json into the engine folder: the fields every engine records, from the plan and the folder's
    tokenizer files, with the backend's own facts; `particular` replaces or adds EngineManifest fields."""
    plan, folder = ctx.plan, ctx.workdir
    spec, recipe = plan.spec, plan.recipe
    shared = {
        "name": plan.name,
        "backend": recipe.target.backend,
        "format": recipe.target.engine_format,
        "dtype": recipe.target.dtype,
        "quantization": spec.quant,
        "limits": recipe.limits,
        "parallel": Parallelism(tp_size=spec.tp_size, pp_size=spec.pp_size),
        "tokenizer": tokenizer_facts(folder),
        "generation_defaults": recipe.generation_defaults,
        "chat": recipe.chat,
        "build": build_info(ctx),
    }
    manifest = EngineManifest(**{**shared, "model": model, "kv_cache": kv_cache, "weights_bytes": weights_bytes,
                                 **particular})
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
