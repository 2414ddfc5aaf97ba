"""Planning and building `llamacpp` engines: a GGUF file served by llama.cpp.

The engine folder holds the GGUF file (`model.gguf`): the source file as it is (hard-linked where the filesystem
allows, else copied), or, where the recipe names a `target.gguf_type`, the source's weights written as that type
by llama.cpp's quantize API (build_scripts/gguf_requantize.py). Beside it: the Hugging Face tokenizer made from the
file's own vocabulary (`tokenizer.json`: the HTTP process tokenises with it; requests reach llama.cpp as token
ids), the chat template the file carries, and the manifest, which names the llama.cpp build the file was loaded
and checked with (build_scripts/gguf_check.py). Both llama.cpp steps run as processes of their own because
llama.cpp aborts its process on some errors.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from build_scripts.environment import Environment
from build_scripts.manifest_facts import build_info, model_facts, write_manifest
from build_scripts.plan import BuildContext, BuildStep, Plan, engine_folders, new_plan
from build_scripts.sources import Checkpoint
from build_scripts.spec import BuildOptions, BuildSpec
from orchestrator.engine.manifest import MANIFEST_FILE, KvCacheFacts

MODEL_FILE = "model.gguf"
CHECK_FILE = "llamacpp-check.json"
LLAMA_CPP_COMMITS = {"0.3.36": "0c1e570"}  # llama-cpp-python release -> the llama.cpp commit it bundles


def plan_gguf(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Environment) -> Plan:
    folders = engine_folders(spec, options)
    source = checkpoint.path or Path("<FILE.gguf>")
    check = (sys.executable, "-m", "build_scripts.gguf_check", str(folders.staging / MODEL_FILE),
             str(folders.staging / "tokenizer.json"), str(folders.scratch / CHECK_FILE))
    steps = (
        _weights_step(source, folders.staging / MODEL_FILE, spec.recipe.target.gguf_type),
        BuildStep("tokenizer", "write tokenizer.json and the chat template from the GGUF file's vocabulary",
             action=write_tokenizer),
        BuildStep("check", "load the file with llama.cpp and compare its tokenisation with tokenizer.json", argv=check,
             tool="gguf_check"),
        BuildStep("manifest", f"write {MANIFEST_FILE}", action=write_gguf_manifest),
    )
    return new_plan(spec, options, checkpoint, env, steps, scratch=True)


def _weights_step(source: Path, target: Path, gguf_type: str | None) -> BuildStep:
    """The source file linked in as it is, or (with a gguf_type) written as that type in a process of its own."""
    if gguf_type is None:
        return BuildStep("place", f"link (or copy) {source.name} into the engine as {MODEL_FILE}", action=place_gguf)
    argv = (sys.executable, "-m", "build_scripts.gguf_requantize", str(source), str(target), gguf_type)
    return BuildStep("requantize", f"write {source.name}'s weights as {gguf_type} into the engine as {MODEL_FILE} "
                "(llama.cpp's quantize API)", argv=argv, tool="gguf_requantize")


def place_gguf(ctx: BuildContext) -> None:
    source, target = ctx.plan.checkpoint.path, ctx.workdir / MODEL_FILE
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed
        shutil.copyfile(source, target)


def _gguf_fields(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(path))
    wanted = ("tokenizer.chat_template", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
              "tokenizer.ggml.padding_token_id")
    return {name: reader.fields[name].contents() for name in wanted if name in reader.fields}


def write_tokenizer(ctx: BuildContext) -> None:
    """tokenizer.json and tokenizer_config.json through transformers' GGUF reader (vocabulary only, no weights);
    the chat template and end, begin and pad tokens from the file's metadata."""
    from transformers import AutoTokenizer

    folder = ctx.workdir
    model = folder / MODEL_FILE
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=MODEL_FILE)
    tokenizer.save_pretrained(folder)
    fields = _gguf_fields(model)
    template = fields.get("tokenizer.chat_template")
    if template:
        (folder / "chat_template.jinja").write_text(template)
    eos = fields.get("tokenizer.ggml.eos_token_id", tokenizer.eos_token_id)
    generation = {
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": fields.get("tokenizer.ggml.padding_token_id", eos),
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _end_tokens(folder: Path, eog_tokens: list[int]) -> None:
    """The file's end token plus every token llama.cpp treats as end of generation (e.g. Llama 3's <|eot_id|>)."""
    path = folder / "generation_config.json"
    generation = json.loads(path.read_text())
    eos = generation["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    generation["eos_token_id"] = list(dict.fromkeys([*eos, *eog_tokens]))
    path.write_text(json.dumps(generation, indent=2))


def write_gguf_manifest(ctx: BuildContext) -> None:
    """The facts llama.cpp measured (gguf_check) go in: parameters, the file's quantisation, the KV cache's bytes per
    token, the end-of-generation tokens and the llama.cpp build."""
    plan, folder = ctx.plan, ctx.workdir
    facts = json.loads((plan.scratch / CHECK_FILE).read_text())
    _end_tokens(folder, facts["eog_tokens"])  # before write_manifest reads the tokenizer's end tokens
    version = facts["llama_cpp_python"]
    tools = {**plan.tools, "llama_cpp_python": version, "llama_cpp": LLAMA_CPP_COMMITS.get(version, "unknown")}
    write_manifest(
        ctx,
        model=model_facts(plan, parameters=facts["n_params"]),
        kv_cache=KvCacheFacts(
            tokens_per_block=1,  # a llama.cpp KV cell holds one token
            bytes_per_token=facts["kv_bytes_per_token_f16"],
            default_budget_bytes=plan.recipe.kv_cache.default_budget_bytes,
        ),
        weights_bytes=(folder / MODEL_FILE).stat().st_size,
        dtype="float16",  # llama.cpp computes and caches K and V in 16 bits; the weights keep the file's types
        quantization=facts["quantization"],
        build=build_info(ctx).model_copy(update={"tools": tools}),
    )
