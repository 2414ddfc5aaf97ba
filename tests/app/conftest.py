"""The app tier's fixtures."""

from __future__ import annotations

import pytest

from orchestrator.engine.catalogue import Catalogue
from tests.app.harness import one_model


@pytest.fixture(scope="session")
def catalogue(default_engine) -> Catalogue:
    """The real SmolLM2 engine (manifest, tokenizer, chat template), read once."""
    return one_model(default_engine)
