"""Finding checkpoints without a network: a given folder, or the local Hugging Face cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from build_scripts.sources import find_in_hf_cache, folder_problem, hf_hub_cache, resolve_checkpoint

REPO = "meta-llama/Meta-Llama-3-8B-Instruct"


def snapshot(cache: Path, revision: str, files=("config.json", "tokenizer.json", "model.safetensors")) -> Path:
    folder = cache / "models--meta-llama--Meta-Llama-3-8B-Instruct" / "snapshots" / revision
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text(name)
    return folder


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "/hub", "HF_HOME": "/hf"}, "/hub"),
        ({"HF_HOME": "/hf", "XDG_CACHE_HOME": "/xdg"}, "/hf/hub"),
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/huggingface/hub"),
        ({}, "/home/u/.cache/huggingface/hub"),
    ],
)
def test_the_cache_folder_follows_the_hub_rules(env, expected):
    assert hf_hub_cache(env, Path("/home/u")) == Path(expected)


def test_the_snapshot_refs_main_points_at_wins(tmp_path):
    snapshot(tmp_path, "aaaa")
    main = snapshot(tmp_path, "bbbb")
    later = snapshot(tmp_path, "cccc")
    os.utime(later, (later.stat().st_atime, main.stat().st_mtime + 10))
    assert find_in_hf_cache(tmp_path, REPO) == later  # no ref: the newest snapshot
    (tmp_path / "models--meta-llama--Meta-Llama-3-8B-Instruct" / "refs").mkdir()
    (tmp_path / "models--meta-llama--Meta-Llama-3-8B-Instruct" / "refs" / "main").write_text("bbbb\n")
    assert find_in_hf_cache(tmp_path, REPO) == main
    assert find_in_hf_cache(tmp_path, "someone/else") is None


def test_a_cached_checkpoint_is_used_when_none_is_given(catalogue, tmp_path):
    folder = snapshot(tmp_path, "abc123")
    found = resolve_checkpoint(catalogue["llama3-8b"], None, tmp_path)
    assert (found.path, found.problem) == (folder, None)
    assert "in the Hugging Face cache" in found.origin
    assert set(found.identity) == {"config.json", "tokenizer.json", "model.safetensors"}


def test_a_given_folder_wins_over_the_cache(catalogue, tmp_path, hf_folder):
    snapshot(tmp_path / "hub", "abc123")
    found = resolve_checkpoint(catalogue["llama3-8b"], hf_folder, tmp_path / "hub")
    assert found.path == hf_folder and found.origin == "--checkpoint"


def test_folder_problems_name_what_is_missing(tmp_path):
    assert folder_problem(tmp_path / "nope") == f"the checkpoint {tmp_path / 'nope'} does not exist"
    folder = snapshot(tmp_path, "x", files=("config.json",))
    assert folder_problem(folder).endswith("no tokenizer.json, weights (*.safetensors)")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "pytorch_model.bin").write_text("w")
    assert folder_problem(folder) is None
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert folder_problem(gguf, gguf_ok=True) is None
    assert folder_problem(gguf).endswith("is a file; give its folder")  # TensorRT-LLM converts folders only


def test_the_embedded_default_comes_from_its_wheel(catalogue):
    found = resolve_checkpoint(catalogue["smollm2-135m"], None, None)
    assert found.problem is None and found.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
