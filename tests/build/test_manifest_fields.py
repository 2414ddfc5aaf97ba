"""Fields the build adds to engine.json are optional: older manifests load, and a refusal names the
rebuild command the build recorded."""

from __future__ import annotations

import json

import pytest

from orchestrator.engine.manifest import EngineRefused, load_manifest
from tests.conftest import copy_engine


def rewrite(folder, change):
    path = folder / "engine.json"
    data = json.loads(path.read_text())
    change(data)
    path.unlink()  # hard-linked copy: replace, never edit in place
    path.write_text(json.dumps(data))


def strip_added_fields(data):
    """engine.json as builds wrote it before format, build.rebuild, build.steps and kv_cache.dtype existed."""
    del data["format"], data["build"]["rebuild"], data["build"]["steps"], data["kv_cache"]["dtype"]


def test_a_manifest_written_before_the_new_fields_still_loads(tmp_path, default_engine):
    folder = copy_engine(default_engine, tmp_path, "older")
    rewrite(folder, strip_added_fields)
    manifest = load_manifest(folder)
    assert manifest.format is None and manifest.engine_format == "hf-safetensors"
    assert manifest.build.rebuild is None and manifest.build.steps == () and manifest.kv_cache.dtype is None


def test_a_refusal_names_the_recorded_rebuild_command(tmp_path, default_engine):
    folder = copy_engine(default_engine, tmp_path, "custom")

    def as_trtllm(data):
        data.update(backend="trtllm", format="trt-engine", quantization="fp8", parallel={"tp_size": 2, "pp_size": 1})
        data["build"]["rebuild"] = "make build-engine MODEL=llama3-8b QUANT=fp8 TP=2 'BUILD_ARGS=--name custom'"

    rewrite(folder, as_trtllm)
    with pytest.raises(EngineRefused) as caught:
        load_manifest(folder)
    assert "rank0.engine, rank1.engine" in caught.value.reason
    assert caught.value.rebuild == "make build-engine MODEL=llama3-8b QUANT=fp8 TP=2 'BUILD_ARGS=--name custom'"
    assert str(caught.value).endswith(f"(rebuild with: {caught.value.rebuild})")


def test_a_renamed_folder_falls_back_to_its_own_name(tmp_path, default_engine):
    folder = copy_engine(default_engine, tmp_path, "renamed")
    rewrite(folder, lambda data: data.update(name="elsewhere"))
    with pytest.raises(EngineRefused) as caught:
        load_manifest(folder)
    assert caught.value.rebuild == "make build-engine MODEL=renamed"
