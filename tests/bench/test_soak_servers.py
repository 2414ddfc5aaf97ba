"""The soak's hf engines folder: the given engine under its own name, by hard links on one file system and by
a link to the folder where the run's temporary folder is on another (a /tmp in memory), where hard links fail."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from bench.soak.servers import SoakError, make_hf_engines

MEMORY_FS = Path("/dev/shm")


def engine_folder(parent: Path) -> Path:
    engine = parent / "smollm2-135m"
    engine.mkdir()
    (engine / "engine.json").write_text('{"name": "smollm2-135m"}\n')
    (engine / "model.safetensors").write_bytes(b"weights")
    return engine


def test_on_one_file_system_the_files_are_hard_links(tmp_path):
    engine = engine_folder(tmp_path)
    served = make_hf_engines(tmp_path / "run", engine) / engine.name
    assert not served.is_symlink()
    assert os.path.samefile(served / "model.safetensors", engine / "model.safetensors")
    assert (served / "engine.json").read_text() == (engine / "engine.json").read_text()


def test_across_file_systems_the_folder_is_linked(tmp_path):
    if not MEMORY_FS.is_dir() or MEMORY_FS.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip(f"no second file system at {MEMORY_FS} here")
    engine = engine_folder(tmp_path)
    with tempfile.TemporaryDirectory(dir=MEMORY_FS) as workdir:
        served = make_hf_engines(Path(workdir), engine) / engine.name
        assert served.is_symlink() and served.resolve() == engine.resolve()
        assert sorted(p.name for p in served.iterdir()) == ["engine.json", "model.safetensors"]
    assert (engine / "model.safetensors").read_bytes() == b"weights"  # the run's cleanup left the engine alone


def test_a_folder_without_an_engine_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(SoakError, match=r"no engine at .*inferno build smollm2-135m.*--no-hf"):
        make_hf_engines(tmp_path / "run", tmp_path / "smollm2-135m")
