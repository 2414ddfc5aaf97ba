"""Facts every engine manifest records, read from the files a build produced (shared by hf and trtllm)."""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from build_scripts.plan import BuildContext
from build_scripts.recipe import DTYPE_BYTES
from build_scripts.sources import TOKENIZER_FILES
from build_scripts.spec import rebuild_command
from orchestrator.engine.manifest import BuildInfo, ModelFacts, TokenizerFacts


def copy_tokenizer(source: Path, target: Path) -> list[str]:
    """Copy the tokenizer files a checkpoint folder has; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and not (target / name).exists():
            shutil.copyfile(source / name, target / name)
            copied.append(name)
    return copied


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


def model_facts(ctx: BuildContext, hf_config: dict) -> ModelFacts:
    """What the engine was built from: the recipe, the architecture the checkpoint declares, its path."""
    plan = ctx.plan
    recipe = plan.recipe
    return ModelFacts(
        recipe=recipe.name,
        architecture=(hf_config.get("architectures") or [recipe.architecture])[0],
        source=str(plan.checkpoint.path),
        parameters=recipe.parameters,
    )
