"""The server refuses engine folders whose manifest is missing or inconsistent, saying what to rebuild."""

from __future__ import annotations

import json
import shutil

import pytest

from orchestrator.engine.catalogue import discover
from orchestrator.engine.manifest import EngineRefused, load_manifest
from tests.conftest import copy_engine


@pytest.fixture
def engines(tmp_path, default_engine):
    copy_engine(default_engine, tmp_path, "good")
    return tmp_path


def edit_manifest(folder, change):
    path = folder / "engine.json"
    data = json.loads(path.read_text())
    change(data)
    path.unlink()
    path.write_text(json.dumps(data))


def test_a_good_engine_loads(engines):
    manifest = load_manifest(engines / "good")
    assert manifest.name == "good"
    assert manifest.backend == "hf"


def test_missing_manifest_is_refused_with_the_rebuild_command(engines):
    (engines / "good" / "engine.json").unlink()
    with pytest.raises(EngineRefused) as caught:
        load_manifest(engines / "good")
    assert "engine.json is missing" in str(caught.value)
    assert "make build-engine MODEL=good" in str(caught.value)


def test_name_mismatch_is_refused(engines):
    shutil.move(engines / "good", engines / "renamed")
    with pytest.raises(EngineRefused, match="names the engine 'good', not 'renamed'"):
        load_manifest(engines / "renamed")


def test_missing_weights_are_refused(engines):
    (engines / "good" / "model.safetensors").unlink()
    with pytest.raises(EngineRefused, match=r"model\.safetensors"):
        load_manifest(engines / "good")


def test_inconsistent_limits_are_refused(engines):
    edit_manifest(engines / "good", lambda d: d["limits"].update(max_input_len=9000))
    with pytest.raises(EngineRefused, match="limits"):
        load_manifest(engines / "good")


def test_unknown_schema_is_refused(engines):
    edit_manifest(engines / "good", lambda d: d.update(schema_version=99))
    with pytest.raises(EngineRefused, match="schema_version"):
        load_manifest(engines / "good")


def test_discovery_keeps_good_engines_and_reports_bad_ones(engines, default_engine):
    copy_engine(default_engine, engines, "broken")
    (engines / "broken" / "tokenizer.json").unlink()
    (engines / ".hidden-build-in-progress").mkdir()
    catalogue = discover(engines)
    assert list(catalogue.engines) == ["good"]
    assert list(catalogue.refused) == ["broken"]
    assert "tokenizer.json" in catalogue.refused["broken"].reason


def test_a_format_the_backend_cannot_serve_is_refused(engines):
    edit_manifest(engines / "good", lambda d: d.update(format="trt-engine"))
    with pytest.raises(EngineRefused, match="cannot serve the trt-engine format"):
        load_manifest(engines / "good")
