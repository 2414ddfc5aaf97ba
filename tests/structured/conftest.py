"""Fixtures for the structured-output tests: the real SmolLM2 engine folder (built by the root conftest)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

VOCABULARY_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "engine.json")


@pytest.fixture(scope="session")
def smollm2_dir(default_engine: Path) -> Path:
    return default_engine


@pytest.fixture(scope="session")
def smollm2_vocab_dir(smollm2_dir: Path, tmp_path_factory) -> Path:
    """A private copy of the files that make SmolLM2's vocabulary: the grammar checker keys its cache on
    tokenizer.json's identity, and the shared engine folder may be rebuilt while tests run."""
    folder = tmp_path_factory.mktemp("smollm2-vocabulary")
    for name in VOCABULARY_FILES:
        shutil.copy2(smollm2_dir / name, folder / name)
    return folder
