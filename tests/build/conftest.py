"""Fixtures for the build tests: machines described as data, small checkpoints, a tmp engines folder.

TensorRT-LLM and GPUs are absent here, so planner and preflight tests describe the build machine as an
`Environment` (the same plain data the real probe returns). Real builds use the hf backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_scripts.catalogue import load_catalogue
from build_scripts.environment import Environment
from build_scripts.sources import resolve_checkpoint
from build_scripts.spec import BuildOptions, resolve_spec
from orchestrator.visible_gpus import Gpu
from tests.conftest import ROOT

H100 = "NVIDIA H100 80GB HBM3"
TRTLLM_TOOLS = {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48", "modelopt": "0.37.0", "torch": "2.9.1",
                "transformers": "4.57.3"}
# A recipe building an hf engine from a Hugging Face checkpoint folder, such as the embedded default's
# own engine folder (config.json, model.safetensors, tokenizer files).
HF_CHECKPOINT_RECIPE = """
name = "tiny-hf"
description = "an hf engine from a local Hugging Face checkpoint"
architecture = "LlamaForCausalLM"
parameters = 134_515_008

[source]
kind = "hf-checkpoint"

[target]
backend = "hf"
dtype = "float32"

[limits]
max_batch_size = 8
max_input_len = 1024
max_seq_len = 2048
max_num_tokens = 256

[kv_cache]
tokens_per_block = 32
default_budget_bytes = 67_108_864
"""


def machine(gpus: int = 8, name: str = H100, cc: tuple[int, int] = (9, 0), **changes) -> Environment:
    """A build machine: TensorRT-LLM 1.2.1, `gpus` GPUs of one kind, plenty of disk."""
    fields = {
        "tools": dict(TRTLLM_TOOLS),
        "python": "/usr/bin/python3",
        "free_disk_bytes": 10**13,
        "gpus": tuple(Gpu(i, name, *cc, 80 * 2**30) for i in range(gpus)),
        "gpu_problem": None if gpus else "NVML: NVML Shared Library Not Found",
        "trtllm_build": "/usr/local/bin/trtllm-build",
    }
    fields.update(changes)
    return Environment(**fields)


@pytest.fixture(scope="session")
def catalogue():
    return load_catalogue()


STANDIN = Path(__file__).parent / "standins" / "trtllm_tools.py"


@pytest.fixture
def examples(tmp_path) -> Path:
    """A TensorRT-LLM examples/ folder holding the scripts the catalogue's recipes run, as TEST DOUBLES."""
    folder = tmp_path / "examples"
    for script in ("models/core/llama/convert_checkpoint.py", "models/core/qwen/convert_checkpoint.py",
                   "quantization/quantize.py"):
        (folder / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STANDIN, folder / script)
    return folder


@pytest.fixture
def trtllm_build(tmp_path) -> str:
    """A TEST DOUBLE of trtllm-build (see tests/build/standins/trtllm_tools.py)."""
    path = tmp_path / "bin" / "trtllm-build"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n" + STANDIN.read_text())
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def hf_folder(tmp_path) -> Path:
    """The files a Hugging Face checkpoint folder has, for planning (nothing loads them)."""
    folder = tmp_path / "Meta-Llama-3-8B-Instruct"
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "num_hidden_layers": 32}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model-00001-of-00004.safetensors").write_bytes(b"weights")
    return folder


def make_plan(recipe, env: Environment, **options):
    """Plan a build of `recipe` on `env`; options are BuildOptions fields."""
    from build_scripts.hf_engine import plan_hf
    from build_scripts.trtllm_engine import plan_trtllm

    opts = BuildOptions(**options)
    spec = resolve_spec(recipe, opts)
    checkpoint = resolve_checkpoint(recipe, opts.checkpoint, opts.hf_hub_cache)
    planner = plan_hf if recipe.target.backend == "hf" else plan_trtllm
    return planner(spec, opts, checkpoint, env)


@pytest.fixture
def recipes_dir(tmp_path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "tiny-hf.toml").write_text(HF_CHECKPOINT_RECIPE)
    return folder


def linked_copy(source: Path, target: Path) -> Path:
    """A copy of a folder sharing its files by hard link (replace a file, never edit it in place)."""
    shutil.copytree(source, target, copy_function=os.link)
    return target


def inferno_build(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "build", *args],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, check=False,
    )
