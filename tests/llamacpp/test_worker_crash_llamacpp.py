"""Worker crashes (tests/e2e/test_worker_crash.py), unchanged, on a llamacpp engine: a killed worker fails its own
requests at once and the model loads again on the next request."""

from tests.e2e.test_worker_crash import *  # noqa: F403 (its tests; `server` comes from conftest here)
