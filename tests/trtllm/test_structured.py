"""The structured-outputs and tool-calling suite (tests/conformance/test_structured_outputs.py) on a real trtllm engine: the
server hands each guide to TensorRT-LLM's Executor as GuidedDecodingParams, over a GuidedDecodingConfig of the
model's vocabulary. The conformance suite runs it on the test double (where the same xgrammar constrains what its
"model" writes, and the double's bindings hold the guided-decoding arguments to the TensorRT-LLM 1.2 facts,
test_conformance.py); here it runs on the real TensorRT-LLM where it is installed."""

from __future__ import annotations

import pytest

from tests.conformance import test_structured_outputs as suite
from tests.trtllm.conftest import serve_trtllm

pytestmark = pytest.mark.e2e

globals().update({name: getattr(suite, name) for name in dir(suite) if name.startswith("test_")})


@pytest.fixture(scope="module", params=[pytest.param("real", marks=pytest.mark.trtllm)])
def trt_server(request, tmp_path_factory):
    yield from serve_trtllm(request.param, request, tmp_path_factory)


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
