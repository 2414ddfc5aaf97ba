"""The test double and the adapter use only what the project's TensorRT-LLM 1.2 facts table lists.

ExecutorConfig stores a misspelled attribute without a word, and the real bindings cannot run here; so the
names are checked against the facts table (tensorrt_llm_1_2_facts.toml, kept in the repository with the
source of every fact): the double's classes, members and arguments, and every name the adapter touches
while it runs through a recording proxy of the double.
"""

from __future__ import annotations

import asyncio
import enum
import importlib
import inspect
from pathlib import Path

import pytest

from orchestrator.backends.options import TrtllmOptions
from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams
from tests.trtllm.conftest import DOUBLES, make_trtllm_engine
from tests.trtllm.recording import Recorder
from tests.trtllm.reference import FACTS, Reference, read_build_tools, read_reference


@pytest.fixture(scope="module")
def reference() -> Reference:
    if not FACTS.is_file():
        pytest.fail(f"the TensorRT-LLM 1.2 facts table is missing ({FACTS})")
    return read_reference(FACTS)


@pytest.fixture(scope="module")
def double(doubles_on_path):
    return importlib.import_module("tensorrt_llm.bindings.executor")


def _members(cls) -> set[str]:
    if issubclass(cls, enum.Enum):
        return set(cls.__members__)
    names = {name for name in vars(cls) if not name.startswith("_")}
    names |= {name for name in getattr(cls, "__slots__", ()) if not name.startswith("_")}
    return names


def _arguments(cls) -> set[str]:
    if issubclass(cls, enum.Enum):
        return set()
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def test_the_reference_is_parsed(reference):
    """Guards the parser: a reference it misreads would make every other check here pass or fail for nothing."""
    assert {"Executor", "ExecutorConfig", "KvCacheConfig", "Request", "FinishReason", "IterationStats"} <= reference.names
    assert {"max_gpu_total_bytes", "enable_chunked_context", "iter_latency_ms", "gpu_mem_usage"} <= reference.names
    assert {"RequestPerfMetrics", "KvCacheMetrics", "num_reused_blocks", "return_perf_metrics"} <= reference.names
    assert {"perf metrics", "prefix reuse"} <= {fact.topic for fact in reference.facts}
    assert "max_gpu_total_byte" not in reference.names and "priority_value" not in reference.names
    assert reference.request_positional == ("input_token_ids", "max_tokens")
    assert reference.sampling_positional == ("beam_width",)
    assert reference.kv_cache_positional[:2] == ("enable_block_reuse", "max_tokens")
    assert "max_gpu_total_bytes" in reference.kv_cache_keyword_only


def test_the_third_readings_facts_are_in_the_table(reference):
    """normalize_log_probs, the generation-logits build flag's deprecation and the top-k clip (reference §9),
    which the adapter's configuration and requests rely on."""
    facts = {fact.topic: fact.fact for fact in reversed(reference.facts)}
    assert "normalize_log_probs" in reference.names and "defaults to True" in facts["normalize_log_probs"]
    assert "no build flag" in facts["generation logits"]
    assert "--gather_generation_logits" in read_build_tools().tools["trtllm-build"].deprecated
    assert "1024" in facts["top_k"]


def test_every_class_and_fact_names_its_sources(reference):
    assert len(reference.facts) >= 20 and any(fact.correction for fact in reference.facts)
    uncited = sorted(what for what, sources in reference.cited.items() if not sources)
    assert not uncited, f"no sources for: {uncited}"
    unknown = {what: sorted(set(sources) - reference.sources) for what, sources in reference.cited.items()}
    assert not {what: keys for what, keys in unknown.items() if keys}, "source keys missing from [sources]"


def test_every_name_of_the_double_is_in_the_reference(reference, double):
    unknown = {name for name in double.__all__ if name not in reference.names}
    for name in double.__all__:
        cls = getattr(double, name)
        unknown |= {f"{name}.{member}" for member in _members(cls) if member not in reference.names}
        unknown |= {f"{name}({arg}=)" for arg in _arguments(cls) if arg not in reference.names}
    assert not unknown, f"the double uses names the reference does not list: {sorted(unknown)}"


def test_the_double_exports_everything_it_defines(double):
    defined = {
        name
        for name, value in vars(double).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__.startswith("tensorrt_llm")
    }
    assert defined == set(double.__all__)


def _keyword_only(cls) -> set[str]:
    return {p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY}


def _positional(cls) -> tuple[str, ...]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self")


def test_the_doubles_argument_rules_follow_the_reference(reference, double):
    assert _positional(double.Request) == reference.request_positional
    assert _positional(double.SamplingConfig) == reference.sampling_positional
    assert _positional(double.KvCacheConfig) == reference.kv_cache_positional
    assert _keyword_only(double.KvCacheConfig) == reference.kv_cache_keyword_only
    assert _keyword_only(double.SamplingConfig) == set(_arguments(double.SamplingConfig)) - {"beam_width"}


def _drive_the_adapter(bindings, default_engine: Path, tmp_path: Path) -> None:
    """Everything the adapter does in a model's life: load, warm up, generate with every option it maps,
    hit a stop word, cancel, meet an error response, read stats, build a multi-GPU config, shut down."""
    from orchestrator.backends.trtllm.backend import TrtllmBackend
    from orchestrator.backends.trtllm.config import build_executor_config
    from orchestrator.backends.trtllm.runtime import Runtime

    runtime = Runtime(bindings=bindings, version="1.2.1", package_dir=DOUBLES / "tensorrt_llm")
    folder = make_trtllm_engine(default_engine, tmp_path, "recorded", build={"max_input_len": 40})
    manifest = load_manifest(folder)
    options = TrtllmOptions(prompt_cache_bytes=2**30, retain_system_prompt=True)  # the host tier and retention too
    settings = BackendSettings(folder, manifest, manifest.kv_cache.default_budget_bytes, options)
    two_gpus = make_trtllm_engine(default_engine, tmp_path, "two-gpus", tp=2)
    build_executor_config(bindings, BackendSettings(two_gpus, load_manifest(two_gpus), 2**28), runtime)

    async def life() -> list[FinishReason]:
        backend = TrtllmBackend(settings, runtime)
        streams = RequestStreams(backend)
        await backend.start(streams)
        sampled = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=7, presence_penalty=0.5,
                                 frequency_penalty=0.25)
        requests = [
            EngineRequest("stop", tuple(range(300, 330)), 64, stop=(" the",), logprobs=True, priority=3),
            EngineRequest("sampled", tuple(range(300, 330)), 8, sampling=sampled, system_prefix_tokens=12),
            EngineRequest("too-long", tuple(range(300, 350)), 8),
            EngineRequest("fields", tuple(range(300, 330)), 8, ignore_eos=True, min_tokens=2, stop_token_ids=(305,),
                          sampling=SamplingParams(0.7, 0.9, 0, seed=1, repetition_penalty=1.2, min_p=0.1,
                                                  logit_bias=((310, 3.0),))),
        ]
        finishes = []
        for request in requests:
            async for delta in streams.stream(request):
                finishes.append(delta.finish)
        async for delta in streams.stream(EngineRequest("cancelled", tuple(range(300, 330)), 1000)):
            backend.cancel("cancelled")
            finishes.append(delta.finish)
        backend.stats()
        await backend.close()
        return [f for f in finishes if f is not None]

    finishes = asyncio.run(life())
    assert FinishReason.ERROR in finishes and FinishReason.CANCELLED in finishes  # every path was taken


def test_the_adapter_uses_only_names_in_the_reference(reference, double, default_engine, tmp_path):
    recorder = Recorder()
    _drive_the_adapter(recorder.wrap(double), default_engine, tmp_path)
    assert {"ExecutorConfig", "KvCacheConfig", "await_responses", "get_latest_iteration_stats"} <= recorder.names
    assert {"return_perf_metrics", "request_perf_metrics", "kv_cache_metrics", "num_reused_blocks"} <= recorder.names
    assert {"host_cache_size", "KvCacheRetentionConfig", "TokenRangeRetentionConfig"} <= recorder.names
    unknown = sorted(recorder.names - reference.names)
    assert not unknown, f"the adapter uses names the TensorRT-LLM 1.2 reference does not list: {unknown}"


def test_a_misspelled_executor_config_attribute_is_caught(reference, double):
    """The failure this file exists for: ExecutorConfig keeps a typo as a new attribute, silently."""
    recorder = Recorder()
    bindings = recorder.wrap(double)
    config = bindings.ExecutorConfig(max_beam_width=1)
    config.enable_chunked_contxt = True  # accepted without complaint
    assert recorder.names - reference.names == {"enable_chunked_contxt"}
