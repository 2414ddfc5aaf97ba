"""TensorRT-LLM 1.2's log probability normalisation, generation logits without a build flag, the top-k clip,
orchestrator mode's queue-full and shutdown, and guided decoding set up at load (reference §9): first on the test
double, which must behave as the real Executor does, then through the adapter."""

from __future__ import annotations

import importlib
import math
import time
from datetime import timedelta

import pytest

from orchestrator.backends import features_of
from orchestrator.backends.trtllm.backend import TrtllmBackend
from orchestrator.backends.trtllm.config import build_executor_config
from orchestrator.backends.trtllm.requests import MAX_ENGINE_TOP_K, engine_top_k
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams
from orchestrator.errors import InvalidRequest
from orchestrator.structured.guide import Guide
from tests.trtllm.conftest import DOUBLES, make_trtllm_engine
from tests.trtllm.test_adapter import VOCAB, drain, run, settings_for, started
from tests.trtllm.test_adapter import runtime as runtime
from tests.trtllm.test_double import PROMPT, WAIT, collect, request

# The double's "model": logit 10 for the prompt's next token, 9 and 8 for two others, 0 for every other token.
MODEL_LOG_PROB = 10 - math.log(math.exp(10) + math.exp(9) + math.exp(8) + VOCAB - 3)


@pytest.fixture(scope="module")
def trt(doubles_on_path):
    return importlib.import_module("tensorrt_llm.bindings.executor")


@pytest.fixture(scope="module")
def folder(default_engine, tmp_path_factory):
    return make_trtllm_engine(default_engine, tmp_path_factory.mktemp("faults"))


def log_probs(trt, folder, sampling, **config) -> list[float]:
    executor = trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(**config))
    try:
        output = trt.OutputConfig(exclude_input_from_output=True, return_log_probs=True)
        ask = request(trt, max_tokens=3, output_config=output, sampling_config=sampling)
        return collect(executor, executor.enqueue_request(ask))[-1].result.log_probs[0]
    finally:
        executor.shutdown()


# -- the double -------------------------------------------------------------------------------------------------
def test_the_double_normalises_log_probs_over_the_top_k_set_by_default(trt, folder):
    assert log_probs(trt, folder, trt.SamplingConfig(top_k=1)) == [0.0, 0.0, 0.0]  # every greedy token
    top3 = log_probs(trt, folder, trt.SamplingConfig(top_k=3, top_p=1.0, temperature=1.0))
    assert top3 == pytest.approx([10 - math.log(math.exp(10) + math.exp(9) + math.exp(8))] * 3)


def test_without_normalisation_the_double_gives_the_models_own_log_probs(trt, folder):
    for sampling in (trt.SamplingConfig(top_k=1), trt.SamplingConfig(top_k=3, top_p=1.0, temperature=1.0)):
        assert log_probs(trt, folder, sampling, normalize_log_probs=False) == pytest.approx([MODEL_LOG_PROB] * 3)


def test_the_double_clips_top_k_above_1024_with_the_engines_warning(trt, folder, capfd):
    executor = trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig())
    try:
        for top_k in (1024, 5000, 0):
            sampling = trt.SamplingConfig(top_k=top_k, top_p=1.0, temperature=1.0)
            collect(executor, executor.enqueue_request(request(trt, max_tokens=1, sampling_config=sampling)))
        assert executor._engine.top_k_clipped == [5000]
    finally:
        executor.shutdown()
    assert "TopK (5000) is larger than max supported number (1024)" in capfd.readouterr().err


def orchestrator_executor(trt, default_engine, tmp_path, **config):
    folder = make_trtllm_engine(default_engine, tmp_path, "two", tp=2)
    worker = str(DOUBLES / "tensorrt_llm" / "bin" / "executorWorker")
    parallel = trt.ParallelConfig(communication_mode=trt.CommunicationMode.ORCHESTRATOR,
                                  orchestrator_config=trt.OrchestratorConfig(worker_executable_path=worker))
    return trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(parallel_config=parallel, **config))


def test_a_full_queue_raises_at_enqueue_with_one_gpu(trt, folder):
    executor = trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(max_queue_size=1))
    try:
        with pytest.raises(RuntimeError, match="Maximum queue size of 1"):
            executor.enqueue_requests([request(trt), request(trt)])
    finally:
        executor.shutdown()


def test_a_full_queue_is_an_error_response_in_orchestrator_mode(trt, default_engine, tmp_path):
    executor = orchestrator_executor(trt, default_engine, tmp_path, max_queue_size=1)
    try:
        ids = executor.enqueue_requests([request(trt), request(trt)])  # does not raise
        answers = [executor.await_responses(one, timeout=WAIT)[-1] for one in ids]
    finally:
        executor.shutdown()
    assert all(answer.has_error() and "Maximum queue size of 1" in answer.error_msg for answer in answers)


def test_shutdown_in_orchestrator_mode_returns_before_the_work_drains(trt, default_engine, tmp_path):
    executor = orchestrator_executor(trt, default_engine, tmp_path)
    long = executor.enqueue_request(request(trt, max_tokens=10_000))
    executor.await_responses(long, timeout=WAIT)  # running
    started = time.perf_counter()
    executor.shutdown()
    assert time.perf_counter() - started < 5  # 10,000 steps of 5 ms would take 50 s
    assert long not in executor._engine.finish_reasons  # its last responses are never sent


def test_a_guided_decoder_that_cannot_be_built_fails_the_load(trt, default_engine, tmp_path, runtime):
    folder = make_trtllm_engine(default_engine, tmp_path, "unguided", plan={"guided_setup_error": "bad vocabulary"})
    config = build_executor_config(trt, settings_for(folder), runtime)
    with pytest.raises(RuntimeError, match="bad vocabulary"):
        trt.Executor(folder, trt.ModelType.DECODER_ONLY, config)
    trt.Executor(folder, trt.ModelType.DECODER_ONLY, build_executor_config(
        trt, settings_for(folder), runtime, guided=False)).shutdown()


# -- the adapter ------------------------------------------------------------------------------------------------
def test_the_executor_config_asks_for_the_models_own_log_probs(trt, runtime, folder):
    assert build_executor_config(trt, settings_for(folder), runtime).normalize_log_probs is False


def test_generation_logits_are_gathered_only_where_the_models_setting_says(trt, runtime, folder):
    assert build_executor_config(trt, settings_for(folder), runtime).gather_generation_logits is False
    on = build_executor_config(trt, settings_for(folder, generation_logits=True), runtime)
    assert on.gather_generation_logits is True


def test_refused_top_logprobs_name_the_models_setting(folder):
    manifest = load_manifest(folder)
    refused = features_of(manifest)
    assert not refused.top_logprobs and "generation_logits setting" in refused.top_logprobs_note
    assert "--gather_generation_logits" not in refused.top_logprobs_note  # deprecated in 1.2: no rebuild needed
    assert features_of(manifest.model_copy(update={"generation_logits": True})).top_logprobs


@pytest.mark.parametrize(("asked", "sent"), [(0, 0), (1, 1), (40, 40), (1024, 1024), (1025, 0), (VOCAB - 1, 0),
                                             (VOCAB, 0), (10 * VOCAB, 0)])
def test_top_k_above_what_the_engine_can_truncate_is_the_whole_vocabulary(asked, sent):
    assert engine_top_k(asked) == sent <= MAX_ENGINE_TOP_K


def test_greedy_and_sampled_requests_get_the_models_log_probs(trt, runtime, folder):
    async def life():
        backend = TrtllmBackend(settings_for(folder), runtime)
        streams = await started(backend)
        prompt = tuple(PROMPT)
        greedy = await drain(streams.stream(EngineRequest("g", prompt, 3, SamplingParams(0.0), logprobs=True)))
        sampled = await drain(streams.stream(EngineRequest(
            "s", prompt, 3, SamplingParams(1.0, top_k=VOCAB, top_p=1.0, seed=1), logprobs=True)))
        clipped = list(backend._executor._engine.top_k_clipped)
        await backend.close()
        return greedy, sampled, clipped

    greedy, sampled, clipped = run(life())
    for deltas in (greedy, sampled):
        assert [p for d in deltas for p in d.logprobs or []] == pytest.approx([MODEL_LOG_PROB] * 3)  # not 0.0
    assert clipped == []  # top_k = the vocabulary went as 0, never clipped to 1024


def test_a_failed_guided_setup_leaves_the_model_serving_unguided_requests(trt, runtime, default_engine, tmp_path):
    folder = make_trtllm_engine(default_engine, tmp_path, "unguided", plan={"guided_setup_error": "bad vocabulary"})

    async def life():
        backend = TrtllmBackend(settings_for(folder), runtime)
        streams = await started(backend)  # the load went on without guided decoding
        plain = await drain(streams.stream(EngineRequest("plain", tuple(PROMPT), 3)))
        with pytest.raises(InvalidRequest, match=r"guided decoding could not be set up.*bad vocabulary") as refused:
            backend.submit(EngineRequest("guided", tuple(PROMPT), 3, guide=Guide("json_object")))
        await backend.close()
        return plain, refused.value

    plain, refused = run(life())
    assert plain[-1].finish is FinishReason.LENGTH and sum(len(d.token_ids) for d in plain) == 3
    assert refused.param == "response_format"


def test_a_model_whose_guided_setup_works_keeps_it(trt, runtime, folder):
    async def life():
        backend = TrtllmBackend(settings_for(folder), runtime)
        await started(backend)
        problem = backend._guided_problem
        await backend.close()
        return problem

    assert run(life()) is None


def test_await_on_a_shut_down_orchestrator_executor_raises(trt, default_engine, tmp_path):
    executor = orchestrator_executor(trt, default_engine, tmp_path)
    executor.shutdown()
    with pytest.raises(RuntimeError, match="Shutdown called"):
        executor.await_responses(timeout=timedelta(seconds=1))


def test_the_models_setting_reaches_the_feature_check_and_the_load(folder):
    from orchestrator.backends.options import options_for
    from orchestrator.engine.catalogue import discover
    from orchestrator.scheduler.entries import _as_served
    from orchestrator.scheduler.settings import ModelSettings

    engine = discover(folder.parent).engines[folder.name]
    assert _as_served(engine, ModelSettings()) is engine  # unset: the manifest's (off)
    served = _as_served(engine, ModelSettings(generation_logits=True))
    assert features_of(served.manifest).top_logprobs
    assert options_for("trtllm", {"generation_logits": served.manifest.generation_logits}).generation_logits is True


def test_the_checkers_xgrammar_is_compared_with_the_engines_at_load(monkeypatch, caplog):
    from importlib import metadata

    from orchestrator.backends.trtllm.backend import check_xgrammar_version
    from orchestrator.engine import trtllm_release

    installed = metadata.version("xgrammar")
    with caplog.at_level("WARNING"):
        check_xgrammar_version()
        assert installed != trtllm_release.XGRAMMAR_VERSION or not caplog.records  # the same: nothing to say
        monkeypatch.setattr(trtllm_release, "XGRAMMAR_VERSION", "0.0.1")
        check_xgrammar_version()
    assert f"xgrammar is {installed}" in caplog.text and "xgrammar 0.0.1" in caplog.text
