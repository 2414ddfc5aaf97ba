"""Fixtures for the trtllm backend: TensorRT-LLM-shaped engine folders, and servers that run them either on
the test double of TensorRT-LLM's bindings (tests/doubles, put first on the server's PYTHONPATH) or, where
the `tensorrt_llm` package is importable, on the real thing with an engine built by `make build-engine`."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DOUBLES, ENGINES, TRTLLM_ABSENT, ServerProcess, real_tensorrt_llm, start_server

TEST_MODEL = "tiny-trt"
DOUBLE_VERSION = "1.2.1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
KV_DTYPE_BYTES = 2  # bfloat16
TOKENS_PER_BLOCK = 32
KV_BUDGET_BYTES = 256 * 2**20


def double_env() -> dict[str, str]:
    """Environment for a server (and its workers) that imports the test double as `tensorrt_llm`."""
    path = os.pathsep.join(p for p in (str(DOUBLES), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


# -- engine folders ---------------------------------------------------------------------------------------------
def trtllm_config(hf: dict, tp: int = 1, **build) -> dict:
    """config.json as trtllm-build writes it (rank 0), for the model shape of a Hugging Face config."""
    build_config = {
        "max_input_len": 6144, "max_seq_len": 8192, "max_batch_size": 32, "max_beam_width": 1,
        "max_num_tokens": 512, "opt_num_tokens": None, "kv_cache_type": "PAGED",
        "gather_context_logits": False, "gather_generation_logits": False,
        "plugin_config": {
            "tokens_per_block": TOKENS_PER_BLOCK, "gpt_attention_plugin": "auto", "gemm_plugin": None,
            "context_fmha": True, "use_paged_context_fmha": True, "remove_input_padding": True,
        },
    }
    build_config.update(build)
    return {
        "version": DOUBLE_VERSION,
        "pretrained_config": {
            "architecture": hf["architectures"][0],
            "dtype": "bfloat16",
            "vocab_size": hf["vocab_size"],
            "hidden_size": hf["hidden_size"],
            "num_hidden_layers": hf["num_hidden_layers"],
            "num_attention_heads": hf["num_attention_heads"],
            "num_key_value_heads": hf["num_key_value_heads"],
            "head_size": hf["head_dim"],
            "intermediate_size": hf["intermediate_size"],
            "max_position_embeddings": hf["max_position_embeddings"],
            "hidden_act": hf["hidden_act"],
            "norm_epsilon": hf["rms_norm_eps"],
            "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1, "cp_size": 1, "rank": 0},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": build_config,
    }


def make_trtllm_engine(
    source: Path,
    engines_dir: Path,
    name: str = TEST_MODEL,
    *,
    tp: int = 1,
    plan: dict | None = None,
    build: dict | None = None,
    tools: dict | None = None,
) -> Path:
    """An engine folder as `make build-engine` would make for TensorRT-LLM: the tokenizer files of `source`
    (the embedded SmolLM2), a TensorRT-LLM config.json of its shape, placeholder rank<N>.engine files (the
    double reads rank0.engine as a fault plan when it is JSON), and the manifest. `build` changes config.json
    only, making an engine that disagrees with its manifest; `tools` replaces the manifest's tool versions."""
    folder = engines_dir / name
    folder.mkdir(parents=True)
    for file in TOKENIZER_FILES:
        if (source / file).is_file():
            shutil.copyfile(source / file, folder / file)
    hf = json.loads((source / "config.json").read_text())
    config = trtllm_config(hf, tp, **(build or {}))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(tp):
        (folder / f"rank{rank}.engine").write_text(json.dumps(plan or {"placeholder": "not a TensorRT plan"}))
    manifest = json.loads((source / "engine.json").read_text())
    build_config = trtllm_config(hf, tp)["build_config"]  # what the manifest promises, whatever `build` changed
    manifest.update(
        name=name,
        backend="trtllm",
        format="trt-engine",
        dtype="bfloat16",
        limits={key: build_config[key] for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")},
        parallel={"tp_size": tp, "pp_size": 1},
        kv_cache={
            "tokens_per_block": TOKENS_PER_BLOCK,
            "bytes_per_token": 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * hf["head_dim"] * KV_DTYPE_BYTES,
            "default_budget_bytes": KV_BUDGET_BYTES,
        },
        build={
            "fingerprint": f"sha256:{name}-test-engine",
            "built_at": manifest["build"]["built_at"],
            "duration_s": 0.0,
            "tools": tools or {"tensorrt_llm": DOUBLE_VERSION, "tensorrt": "10.14.1.48"},
            "target_arch": "sm90",
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
        },
    )
    (folder / "engine.json").write_text(json.dumps(manifest, indent=2))
    return folder


@pytest.fixture(scope="module")
def doubles_on_path() -> Iterator[None]:
    """The test double importable in this process as `tensorrt_llm` (for in-process tests of the adapter)."""
    if real_tensorrt_llm():
        pytest.skip("the real tensorrt_llm is installed: in-process tests of the double would shadow it")
    sys.path.insert(0, str(DOUBLES))
    yield
    sys.path.remove(str(DOUBLES))
    for module in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[module]


# -- servers ----------------------------------------------------------------------------------------------------
@dataclass
class TrtServer:
    """A server running a trtllm engine; `double` says whether TensorRT-LLM is the test double."""

    process: ServerProcess
    model: str
    folder: Path
    double: bool

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def api(self) -> str:
        return self.process.api


def _real_engine() -> Path:
    """The engine for the real-package run: INFERNO_TEST_TRTLLM_MODEL, else the first trtllm engine built."""
    wanted = os.environ.get("INFERNO_TEST_TRTLLM_MODEL")
    candidates = [ENGINES / wanted] if wanted else sorted(p for p in ENGINES.iterdir() if p.is_dir())
    for folder in candidates:
        manifest = folder / "engine.json"
        if manifest.is_file() and json.loads(manifest.read_text()).get("backend") == "trtllm":
            return folder
    pytest.skip(f"no TensorRT-LLM engine under {ENGINES}: build one with make build-engine MODEL=<name> "
                "(or name it with INFERNO_TEST_TRTLLM_MODEL)")


def serve_trtllm(mode: str, request, tmp_path_factory) -> Iterator[TrtServer]:
    """A server of a trtllm engine: on the test double with a generated engine folder, or on the real
    TensorRT-LLM (skipped unless it is importable) with an engine built by `make build-engine`."""
    logs = tmp_path_factory.mktemp("trtllm-server")
    if mode == "double":
        engines = logs / "engines"
        folder = make_trtllm_engine(request.getfixturevalue("default_engine"), engines)
        process = start_server(engines, logs / "server.log", "--models", folder.name, env=double_env())
    else:
        if not real_tensorrt_llm():
            pytest.skip(TRTLLM_ABSENT)
        folder = _real_engine()
        process = start_server(folder.parent, logs / "server.log", "--models", folder.name)
    yield TrtServer(process, folder.name, folder, mode == "double")
    process.stop()


@pytest.fixture(scope="module", params=["double", pytest.param("real", marks=pytest.mark.trtllm)])
def trt_server(request, tmp_path_factory) -> Iterator[TrtServer]:
    """One server per test module and mode: the test double, and the real TensorRT-LLM where it is installed."""
    yield from serve_trtllm(request.param, request, tmp_path_factory)
