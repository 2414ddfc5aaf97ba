"""The structured-outputs and tool-calling suite (tests/e2e/test_structured_outputs.py) on a llamacpp engine: the
backend applies each request's grammar (structured/grammar/matcher.py's RowConstraint, xgrammar's token mask) to its row
of the step's logits after every other adjustment, before the draw, so SmolLM2's Q4_1 file answers with objects
that parse and calls whose arguments validate, as the hf engine does."""

from __future__ import annotations

import pytest

from tests.e2e import test_structured_outputs as suite

pytestmark = pytest.mark.e2e

globals().update({name: getattr(suite, name) for name in dir(suite) if name.startswith("test_")})
client = suite.client
model = suite.model
