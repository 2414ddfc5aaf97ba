"""Real hf builds: the engine folder, the build cache, and atomic output when a build fails or is stopped.

The checkpoint is a hard-linked copy of the embedded default's engine folder (itself a Hugging Face
checkpoint), built by a user recipe (kind "hf-checkpoint") into a temporary engines folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from orchestrator.engine.manifest import load_manifest
from tests.build.conftest import inferno_build, linked_copy
from tests.conftest import ENGINES, HF_RECIPE, ROOT, wait_for


@pytest.fixture
def workspace(tmp_path, default_engine, recipes_dir):
    checkpoint = linked_copy(default_engine, tmp_path / "checkpoint")
    engines = tmp_path / "engines"

    def build(*extra: str, source=checkpoint) -> subprocess.CompletedProcess:
        return inferno_build("tiny-hf", "--recipes-dir", str(recipes_dir), "--checkpoint", str(source),
                             "--engines-dir", str(engines), *extra)

    return checkpoint, engines, build


def hidden(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.exists() else []


@pytest.mark.slow
def test_a_build_then_a_cache_hit_then_a_rebuild_when_the_checkpoint_changes(workspace):
    checkpoint, engines, build = workspace
    first = build()
    assert first.returncode == 0, first.stderr
    assert "[1/2] 0:00:00 convert:" in first.stdout and "[2/2]" in first.stdout and "built " in first.stdout
    engine = engines / "tiny-hf"
    manifest = load_manifest(engine)
    assert (manifest.backend, manifest.engine_format, manifest.model.source) == ("hf", "hf-safetensors", str(checkpoint))
    assert manifest.build.rebuild.startswith("make build-engine MODEL=tiny-hf 'BUILD_ARGS=--checkpoint ")
    assert "=== [1/2] convert" in (engine / "build.log").read_text()
    assert all(p.stat().st_mode & 0o444 == engine.stat().st_mode & 0o444 for p in engine.iterdir())
    assert hidden(engines) == []
    written = (engine / "engine.json").read_text()

    again = build()
    assert again.returncode == 0, again.stderr
    assert f"{engine} is up to date (fingerprint {manifest.build.fingerprint[:19]}" in again.stdout
    assert (engine / "engine.json").read_text() == written

    config = checkpoint / "config.json"
    changed = json.loads(config.read_text()) | {"use_cache": True}
    config.unlink()  # hard-linked to the default engine: replace, never edit in place
    config.write_text(json.dumps(changed, indent=1))
    rebuilt = build()
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "up to date" not in rebuilt.stdout and "built " in rebuilt.stdout
    assert load_manifest(engine).build.fingerprint != manifest.build.fingerprint


@pytest.mark.slow
def test_force_rebuilds_an_up_to_date_engine(workspace):
    _, engines, build = workspace
    assert build().returncode == 0
    before = (engines / "tiny-hf").stat().st_ino
    fingerprint = load_manifest(engines / "tiny-hf").build.fingerprint
    forced = build("--force")
    assert forced.returncode == 0, forced.stderr
    assert "built " in forced.stdout
    assert (engines / "tiny-hf").stat().st_ino != before  # a new folder, swapped in while the old one existed
    assert load_manifest(engines / "tiny-hf").build.fingerprint == fingerprint
    assert hidden(engines) == []


def test_a_failed_build_leaves_no_engine_and_no_temporary_folder(workspace):
    checkpoint, engines, build = workspace
    (checkpoint / "config.json").unlink()
    (checkpoint / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": "thirty"}')
    result = build()
    assert result.returncode == 1
    assert "inferno build: the build failed:" in result.stderr
    assert "--- end of the build log ---" in result.stderr
    assert not (engines / "tiny-hf").exists()
    assert hidden(engines) == [".tiny-hf.failed.log"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_build_leaves_no_engine_and_no_temporary_folder(workspace, recipes_dir, stop):
    checkpoint, engines, _ = workspace
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "build", "tiny-hf", "--recipes-dir", str(recipes_dir),
         "--checkpoint", str(checkpoint), "--engines-dir", str(engines)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    log = engines / f".tiny-hf.build-{process.pid}" / "build.log"
    wait_for(lambda: log.is_file() and "=== [1/2] convert" in log.read_text(), timeout=60, what="the convert step")
    process.send_signal(stop)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "interrupted; the temporary folders were removed, no engine was written" in stderr
    assert not (engines / "tiny-hf").exists()
    assert [name for name in hidden(engines) if not name.endswith(".failed.log")] == []


def test_the_hf_engine_is_a_cache_hit_once_built(default_engine):
    built = ENGINES / HF_RECIPE  # default_engine is a copy of it under the default model's name
    written = (built / "engine.json").read_text()
    result = inferno_build(HF_RECIPE, "--engines-dir", str(ENGINES))
    assert result.returncode == 0, result.stderr
    assert f"{built} is up to date" in result.stdout
    assert (built / "engine.json").read_text() == written
    manifest = load_manifest(built)
    assert manifest.build.target_arch == "any" and manifest.build.tools["transformers"]
    assert os.access(built / "model.safetensors", os.R_OK)
