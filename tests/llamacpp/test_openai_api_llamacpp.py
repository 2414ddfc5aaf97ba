"""The OpenAI API suite (tests/e2e/test_openai_api.py), unchanged, through the real server on a llamacpp engine."""

from tests.e2e.test_openai_api import *  # noqa: F403 (its tests and fixtures; `server` comes from conftest here)
