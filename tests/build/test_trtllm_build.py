"""A TensorRT-LLM build through the real runner, with TEST DOUBLES standing in for TensorRT-LLM's tools
(tests/build/standins/trtllm_tools.py): the engine folder, manifest, log, cache and clean-up.

The checkpoint is the embedded default's engine folder, itself a Hugging Face checkpoint.
"""

from __future__ import annotations

import json
import sys

import pytest

from build_scripts.preflight import preflight
from build_scripts.runner import LOG_FILE, StepFailed, is_up_to_date, run_plan
from orchestrator.engine.catalogue import discover
from orchestrator.engine.manifest import load_manifest
from tests.build.conftest import H100, machine, make_plan


@pytest.fixture
def plan_for(catalogue, default_engine, examples, trtllm_build, tmp_path):
    def plan(**options):
        env = machine(gpus=2, python=sys.executable, trtllm_build=trtllm_build)
        options = {"checkpoint": default_engine, "trtllm_examples": examples, "engines_dir": tmp_path / "engines",
                   **options}
        made = make_plan(catalogue["llama3-8b"], env, **options)
        assert preflight(made) == ()
        return made

    return plan


def test_an_fp8_tp2_engine_folder_and_its_manifest(plan_for, catalogue, default_engine):
    plan = plan_for(quant="fp8", tp=2)
    output = run_plan(plan)
    assert sorted(p.name for p in output.iterdir()) == [
        LOG_FILE, "chat_template.jinja", "config.json", "engine.json", "generation_config.json",
        "rank0.engine", "rank1.engine", "tokenizer.json", "tokenizer_config.json",
    ]
    assert list(output.parent.iterdir()) == [output]  # the scratch folder and the tool's stray files are gone
    manifest = load_manifest(output)
    recipe = catalogue["llama3-8b"]
    assert (manifest.backend, manifest.engine_format, manifest.quantization) == ("trtllm", "trt-engine", "fp8")
    assert (manifest.parallel.tp_size, manifest.parallel.world_size) == (2, 2)
    assert manifest.limits == recipe.limits
    build = manifest.build
    assert (build.tools["tensorrt_llm"], build.tools["tensorrt"]) == ("1.2.1", "10.14.1.48")
    assert (build.target_arch, build.gpu_name, build.compute_capability) == ("sm90", H100, "9.0")
    assert build.fingerprint == plan.fingerprint
    assert build.rebuild.startswith("make build-engine MODEL=llama3-8b QUANT=fp8 TP=2 'BUILD_ARGS=--checkpoint ")
    assert "quantize.py --model_dir" in build.steps[0] and build.steps[1].startswith(plan.environment.trtllm_build)
    hf_config = json.loads((default_engine / "config.json").read_text())
    head_dim = hf_config["hidden_size"] // hf_config["num_attention_heads"]
    fp8_bytes = 2 * hf_config["num_hidden_layers"] * hf_config["num_key_value_heads"] * head_dim
    assert (manifest.kv_cache.dtype, manifest.kv_cache.bytes_per_token) == ("fp8", fp8_bytes)
    assert manifest.kv_cache.default_budget_bytes == 2 * recipe.kv_cache.default_budget_bytes
    assert manifest.tokenizer == load_manifest(default_engine).tokenizer
    log = (output / LOG_FILE).read_text()
    assert "[stand-in quantize.py]" in log and "[stand-in trtllm-build]" in log and "copied tokenizer.json" in log
    assert list(discover(output.parent).engines) == ["llama3-8b"]  # the server takes the folder


def test_the_same_inputs_are_up_to_date_and_other_options_are_not(plan_for):
    plan = plan_for()
    assert not is_up_to_date(plan)
    run_plan(plan)
    assert is_up_to_date(plan_for(build_id="2"))
    assert not is_up_to_date(plan_for(quant="fp8"))
    assert not is_up_to_date(plan_for(tp=2))


def test_a_failing_tool_keeps_the_previous_engine_and_leaves_no_temporary_folder(plan_for, monkeypatch):
    output = run_plan(plan_for())
    before = (output / "engine.json").read_text()
    monkeypatch.setenv("INFERNO_STANDIN_FAIL", "trtllm-build")
    with pytest.raises(StepFailed, match="trtllm-build exited with code 1"):
        run_plan(plan_for(quant="fp8", build_id="3"))
    assert (output / "engine.json").read_text() == before
    failed_log = output.parent / ".llama3-8b.failed.log"
    assert sorted(output.parent.iterdir()) == [failed_log, output]
    assert "failing as asked" in failed_log.read_text()
    monkeypatch.delenv("INFERNO_STANDIN_FAIL")
    run_plan(plan_for(quant="fp8", build_id="4"))
    assert list(output.parent.iterdir()) == [output]  # a later success drops the stale log
