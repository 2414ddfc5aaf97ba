"""Fixtures for the structured-output tests: the real SmolLM2 engine folder (built by the root conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir(default_engine: Path) -> Path:
    return default_engine
