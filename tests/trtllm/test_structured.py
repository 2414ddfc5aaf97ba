"""The structured-outputs and tool-calling suite (tests/e2e/test_structured_outputs.py) on a trtllm engine: the
server hands each guide to TensorRT-LLM's Executor as GuidedDecodingParams, over a GuidedDecodingConfig of the
model's vocabulary. On the test double the same xgrammar constrains what its "model" writes, and the double's
bindings hold the guided-decoding arguments to the TensorRT-LLM 1.2 facts (test_conformance.py)."""

from __future__ import annotations

import pytest

from tests.e2e import test_structured_outputs as suite

pytestmark = pytest.mark.e2e

globals().update({name: getattr(suite, name) for name in dir(suite) if name.startswith("test_")})


@pytest.fixture(scope="module")
def server(trt_server):
    return trt_server.process


@pytest.fixture(scope="module")
def model(trt_server) -> str:
    return trt_server.model


@pytest.fixture(scope="module")
def client(trt_server):
    import openai

    return openai.OpenAI(base_url=trt_server.api, api_key="unused", max_retries=0, timeout=300)
