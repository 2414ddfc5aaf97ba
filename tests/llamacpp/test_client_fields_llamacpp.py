"""The client fields suite (tests/e2e/test_client_fields.py), unchanged, through the real server on a llamacpp
engine: ignore_eos, min_tokens, stop tokens, logit_bias, penalties, min_p, top_logprobs and the rest."""

from tests.e2e.test_client_fields import *  # noqa: F403 (its tests and fixtures; `server` comes from conftest here)
