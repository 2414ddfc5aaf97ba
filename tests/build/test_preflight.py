"""Preflight: every reason a build cannot start, each saying what to do, before anything is written."""

from __future__ import annotations

import importlib.util

import pytest

from build_scripts.environment import MISSING
from build_scripts.preflight import preflight
from tests.build.conftest import inferno_build, machine, make_plan

A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))


def problems_of(catalogue, env, name="llama3-8b", **options):
    return preflight(make_plan(catalogue[name], env, **options))


@pytest.fixture
def ready(examples, hf_folder):
    """Options under which the llama3-8b build has everything it needs on `machine()`."""
    return {"checkpoint": hf_folder, "trtllm_examples": examples}


def test_a_ready_machine_has_no_problems(catalogue, ready):
    assert problems_of(catalogue, machine(gpus=1), **ready) == ()
    assert problems_of(catalogue, machine(gpus=8), name="llama3-70b-instruct", tp=8, quant="fp8", **ready) == ()


def test_missing_tensorrt_llm_says_which_version_and_where_to_get_it(catalogue, ready):
    env = machine(tools={**machine().tools, "tensorrt_llm": MISSING}, trtllm_build=None)
    (problem,) = problems_of(catalogue, env, **ready)
    for expected in ("TensorRT-LLM is not installed", "1.2.1", "nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
                     "deploy/docker/gpu.Dockerfile", "https://pypi.nvidia.com", "--trtllm-examples"):
        assert expected in problem


def test_another_tensorrt_llm_line_is_refused(catalogue, ready):
    (problem,) = problems_of(catalogue, machine(tools={**machine().tools, "tensorrt_llm": "1.3.0rc1"}), **ready)
    assert "TensorRT-LLM 1.3.0rc1 is installed" in problem
    assert "tensorrt_llm==1.2.1" in problem


def test_missing_example_scripts_point_at_the_examples_folder(catalogue, hf_folder, tmp_path):
    (problem,) = problems_of(catalogue, machine(), checkpoint=hf_folder, trtllm_examples=tmp_path / "nowhere")
    assert "convert_checkpoint.py is missing" in problem
    assert "/app/tensorrt_llm/examples" in problem and "--trtllm-examples" in problem


def test_no_gpu(catalogue, ready):
    (problem,) = problems_of(catalogue, machine(gpus=0), **ready)
    assert "no NVIDIA GPU found (NVML: NVML Shared Library Not Found)" in problem
    assert "1 x sm90 Hopper" in problem


def test_another_gpu_architecture_suggests_building_for_it(catalogue, ready):
    name, cc = A100
    (problem,) = problems_of(catalogue, machine(gpus=2, name=name, cc=cc), **ready)
    assert f"the GPUs here are {name} (sm80), but this build targets sm90" in problem
    assert "--arch sm80" in problem
    assert problems_of(catalogue, machine(gpus=2, name=name, cc=cc), arch="sm80", **ready) == ()


def test_too_few_gpus_for_the_parallelism(catalogue, ready):
    (problem,) = problems_of(catalogue, machine(gpus=2), tp=4, **ready)
    assert "this engine runs on 4 GPUs (TP 4 x PP 1) and 2 sm90 GPUs are visible" in problem
    assert "smaller --tp (1, 2)" in problem
    (problem,) = problems_of(catalogue, machine(gpus=2), name="llama3-70b-instruct", **ready)
    assert "4 GPUs" in problem and "--tp" not in problem  # 70B allows no TP below 4


def test_not_enough_disk_gives_the_estimate(catalogue, ready):
    (problem,) = problems_of(catalogue, machine(free_disk_bytes=10 * 10**9), **ready)
    assert "not enough disk" in problem
    assert "about 40.2 GB" in problem and "10.0 GB is free" in problem  # 2 x 16 GB (checkpoint + engine) + 25 %
    (problem,) = problems_of(catalogue, machine(free_disk_bytes=10 * 10**9), quant="fp8", **ready)
    assert "about 20.1 GB" in problem  # FP8 halves it


def test_a_missing_checkpoint_says_how_to_give_one(catalogue, examples, tmp_path):
    (problem,) = problems_of(catalogue, machine(), trtllm_examples=examples, hf_hub_cache=tmp_path / "hub")
    assert "no checkpoint for llama3-8b: pass --checkpoint DIR" in problem
    assert "BUILD_ARGS='--checkpoint DIR'" in problem
    assert f"meta-llama/Meta-Llama-3-8B-Instruct is not in the Hugging Face cache ({tmp_path / 'hub'})" in problem
    assert "Offline (--offline or HF_HUB_OFFLINE=1) the build does not download" in problem
    assert "without --offline and with HF_HUB_OFFLINE unset to let the build fetch them" in problem


def test_an_incomplete_checkpoint_names_what_it_lacks(catalogue, examples, hf_folder):
    (hf_folder / "tokenizer.json").unlink()
    (problem,) = problems_of(catalogue, machine(), checkpoint=hf_folder, trtllm_examples=examples)
    assert problem.endswith("is not a complete Hugging Face checkpoint: no tokenizer.json")


def test_every_problem_is_reported_at_once(catalogue, tmp_path):
    env = machine(gpus=0, tools={**machine().tools, "tensorrt_llm": MISSING}, free_disk_bytes=0)
    problems = problems_of(catalogue, env, checkpoint=tmp_path / "absent")
    assert len(problems) == 4
    assert [p.split()[0] for p in problems] == ["TensorRT-LLM", "no", "the", "not"]


def test_the_hf_build_needs_torch_and_transformers(catalogue):
    env = machine(gpus=0, tools={"torch": MISSING, "transformers": "5.23.0", "safetensors": MISSING})
    problems = problems_of(catalogue, env, name="smollm2-135m-hf")
    assert any("torch, safetensors not installed" in p and "pip install -e '.[hf]'" in p for p in problems)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="TensorRT-LLM is installed here")
def test_building_llama3_8b_here_fails_fast_and_writes_nothing(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    result = inferno_build("llama3-8b", "--engines-dir", str(engines),
                           env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert "inferno build: cannot build llama3-8b here; nothing was written" in result.stderr
    assert "TensorRT-LLM is not installed" in result.stderr
    assert "nvcr.io/nvidia/tensorrt-llm/release:1.2.1" in result.stderr
    assert "no NVIDIA GPU found" in result.stderr or "the GPUs here are" in result.stderr
    assert list(engines.iterdir()) == []


def test_the_dry_run_shows_the_plan_and_the_problems_without_tensorrt_llm(tmp_path):
    engines = tmp_path / "engines"
    result = inferno_build("llama3-8b", "--checkpoint", "/models/Meta-Llama-3-8B-Instruct", "--quant", "fp8",
                           "--tp", "2", "--engines-dir", str(engines), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "quantize.py \\\n" in result.stdout and "trtllm-build \\\n" in result.stdout
    assert "--model_dir /models/Meta-Llama-3-8B-Instruct" in result.stdout
    assert "--workers 2" in result.stdout
    assert "the checkpoint /models/Meta-Llama-3-8B-Instruct does not exist" in result.stdout
    assert not engines.exists()
