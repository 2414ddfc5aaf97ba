"""The test double of TensorRT-LLM's bindings behaves as the reference documents the real ones do; these
are the behaviours the adapter relies on, so a double that drifted would make its tests meaningless."""

from __future__ import annotations

import importlib
import threading
from datetime import timedelta

import pytest

from tests.trtllm.conftest import make_trtllm_engine

WAIT = timedelta(seconds=30)  # an upper bound on waiting for responses, never a pace
PROMPT = [101, 102, 103, 104, 105]
END = 7


@pytest.fixture(scope="module")
def trt(doubles_on_path):
    return importlib.import_module("tensorrt_llm.bindings.executor")


@pytest.fixture(scope="module")
def folder(default_engine, tmp_path_factory):
    return make_trtllm_engine(default_engine, tmp_path_factory.mktemp("double"), build={"max_input_len": 64})


@pytest.fixture
def executor(trt, folder):
    executor = trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(iter_stats_max_iterations=100))
    yield executor
    executor.shutdown()


def collect(executor, request_id: int) -> list:
    """Every response of one request, up to its final one."""
    responses = []
    while not responses or (not responses[-1].has_error() and not responses[-1].result.is_final):
        responses += [r for r in executor.await_responses(timeout=WAIT) if r.request_id == request_id]
    return responses


def request(trt, prompt=PROMPT, max_tokens=8, **kwargs):
    kwargs.setdefault("streaming", True)
    kwargs.setdefault("sampling_config", trt.SamplingConfig(top_k=1))
    kwargs.setdefault("output_config", trt.OutputConfig(exclude_input_from_output=True))
    return trt.Request(list(prompt), max_tokens, **kwargs)


def tokens_of(responses) -> list[int]:
    return [t for r in responses for t in r.result.output_token_ids[0]]


# -- generation -------------------------------------------------------------------------------------------------
def test_streaming_results_carry_only_new_tokens(trt, executor):
    responses = collect(executor, executor.enqueue_request(request(trt, max_tokens=8)))
    assert len(responses) == 8
    assert all(len(r.result.output_token_ids[0]) == 1 for r in responses)
    assert tokens_of(responses) == (PROMPT * 2)[:8]  # greedy: the prompt, repeated
    assert [r.result.is_final for r in responses] == [False] * 7 + [True]
    assert responses[-1].result.finish_reasons == [trt.FinishReason.LENGTH]


def test_a_non_streaming_result_holds_prompt_and_answer_unless_the_input_is_excluded(trt, executor):
    whole = collect(executor, executor.enqueue_request(
        request(trt, max_tokens=3, streaming=False, output_config=trt.OutputConfig())))
    assert len(whole) == 1 and tokens_of(whole) == PROMPT + PROMPT[:3]
    answer = collect(executor, executor.enqueue_request(request(trt, max_tokens=3, streaming=False)))
    assert tokens_of(answer) == PROMPT[:3]


def test_end_id_ends_the_answer_and_is_not_part_of_it(trt, executor):
    prompt = [101, 102, END, 104]
    responses = collect(executor, executor.enqueue_request(request(trt, prompt, max_tokens=20, end_id=END)))
    assert tokens_of(responses) == [101, 102]
    assert responses[-1].result.finish_reasons == [trt.FinishReason.END_ID]


def test_min_tokens_keeps_end_id_from_being_first(trt, executor):
    prompt = [END, 101, 102]  # greedy starts at the prompt's first token, the end token
    responses = collect(executor, executor.enqueue_request(request(trt, prompt, max_tokens=4, end_id=END)))
    assert tokens_of(responses) == [101, 102]
    assert responses[-1].result.finish_reasons == [trt.FinishReason.END_ID]


def test_stop_words_end_the_answer_and_are_part_of_it(trt, executor):
    responses = collect(executor, executor.enqueue_request(request(trt, max_tokens=20, stop_words=[[103, 104]])))
    assert tokens_of(responses) == [101, 102, 103, 104]
    assert responses[-1].result.finish_reasons == [trt.FinishReason.STOP_WORDS]


def test_a_seed_picks_the_answer_and_the_same_seed_gives_the_same_one(trt, executor):
    def sampled(seed):
        config = trt.SamplingConfig(temperature=1.0, top_p=1.0, seed=seed)
        return tokens_of(collect(executor, executor.enqueue_request(request(trt, max_tokens=5, sampling_config=config))))

    assert sampled(2) == sampled(2) == PROMPT[2:] + PROMPT[:2]
    assert sampled(3) != sampled(2)


def test_log_probs_cover_every_token_generated_so_far(trt, executor):
    output = trt.OutputConfig(exclude_input_from_output=True, return_log_probs=True)
    responses = collect(executor, executor.enqueue_request(request(trt, max_tokens=4, output_config=output)))
    assert [len(r.result.log_probs[0]) for r in responses] == [1, 2, 3, 4]
    assert all(p < 0 for p in responses[-1].result.log_probs[0])


# -- errors, cancellation ---------------------------------------------------------------------------------------
def test_an_invalid_request_gets_an_error_response(trt, executor):
    [response] = collect(executor, executor.enqueue_request(request(trt, prompt=list(range(100)))))
    assert response.has_error()
    assert "exceeds maximum input length (64)" in response.error_msg
    with pytest.raises(RuntimeError):
        response.result  # noqa: B018


def test_error_msg_raises_without_an_error(trt, executor):
    [response] = collect(executor, executor.enqueue_request(request(trt, max_tokens=1)))
    assert response.has_error() is False
    with pytest.raises(RuntimeError):
        response.error_msg  # noqa: B018


def test_a_cancelled_request_still_gets_a_final_response(trt, executor):
    request_id = executor.enqueue_request(request(trt, max_tokens=10_000))
    first = executor.await_responses(request_id, timeout=WAIT)
    assert first and not first[-1].result.is_final
    executor.cancel_request(request_id)
    final = collect(executor, request_id)[-1]
    assert final.result.is_final
    assert final.result.finish_reasons == [trt.FinishReason.CANCELLED]
    assert final.result.output_token_ids == [[]]
    executor.cancel_request(request_id)  # already terminated: ignored


# -- stats ------------------------------------------------------------------------------------------------------
def test_iteration_stats_are_drained_by_each_call_and_end_idle(trt, executor):
    executor.get_latest_iteration_stats()
    collect(executor, executor.enqueue_request(request(trt, max_tokens=3)))
    stats = executor.get_latest_iteration_stats()
    assert [s.num_active_requests for s in stats][-2:] == [0, 0] and stats[0].num_active_requests == 1
    assert stats[-1].iter_latency_ms == 0 and stats[0].iter_latency_ms > 0
    assert stats[0].kv_cache_stats.used_num_blocks == 1 and stats[-1].kv_cache_stats.used_num_blocks == 0
    assert executor.get_latest_iteration_stats() == []


def test_kv_cache_size_is_the_smallest_limit(trt, folder):
    def blocks(**kv):
        config = trt.ExecutorConfig(kv_cache_config=trt.KvCacheConfig(**kv))
        with trt.Executor(folder, trt.ModelType.DECODER_ONLY, config) as executor:
            collect(executor, executor.enqueue_request(request(trt, max_tokens=1)))
            return executor.get_latest_iteration_stats()[-1].kv_cache_stats.max_num_blocks

    free = importlib.import_module("tensorrt_llm.bindings._engine").FREE_BYTES_AFTER_LOAD
    block_bytes = 32 * 23040  # tokens per block x bytes per token of the test engine
    assert blocks(max_tokens=320, max_gpu_total_bytes=100 * block_bytes) == 10
    assert blocks(max_tokens=32_000, max_gpu_total_bytes=20 * block_bytes) == 1000  # the byte cap is not read
    assert blocks(max_tokens=32_000, free_gpu_memory_fraction=0.0001) == int(0.0001 * free) // block_bytes
    assert blocks() == int(0.9 * free) // block_bytes  # no fraction given: 0.9


# -- arguments --------------------------------------------------------------------------------------------------
def test_keyword_only_arguments_refuse_positions(trt):
    with pytest.raises(TypeError):
        trt.SamplingConfig(1, 5)
    with pytest.raises(TypeError):
        trt.Request([1, 2], 5, True)
    with pytest.raises(TypeError):
        trt.KvCacheConfig(True, None, None, None, None, None, True, None, None, 0, True)


def test_wrong_names_and_types_are_refused(trt):
    with pytest.raises(TypeError):
        trt.Request([1, 2], 5, streeming=True)
    with pytest.raises(TypeError):
        trt.Request(["a"], 5)
    with pytest.raises(TypeError):
        trt.SamplingConfig(top_k=1.5)
    with pytest.raises(RuntimeError):
        trt.KvCacheConfig(max_tokens=0)


def test_read_only_properties_and_the_missing_priority_property(trt):
    req = trt.Request([1, 2], 5, priority=0.9)
    with pytest.raises(AttributeError):
        req.max_tokens = 6
    with pytest.raises(AttributeError):
        req.priority  # noqa: B018
    with pytest.raises(AttributeError):
        trt.SchedulerConfig().capacity_scheduler_policy = trt.CapacitySchedulerPolicy.MAX_UTILIZATION


def test_only_executor_config_stores_unknown_attributes(trt):
    config = trt.ExecutorConfig()
    config.enable_chunked_contxt = True  # a typo, silently kept
    assert config.enable_chunked_context is False
    with pytest.raises(AttributeError):
        trt.KvCacheConfig().max_token = 5


def test_await_responses_takes_a_timedelta(trt, executor):
    with pytest.raises(TypeError):
        executor.await_responses(timeout=1.5)


# -- parallelism and shutdown -----------------------------------------------------------------------------------
def test_a_multi_gpu_engine_needs_orchestrator_mode_here(trt, default_engine, tmp_path):
    folder = make_trtllm_engine(default_engine, tmp_path, "two", tp=2)
    with pytest.raises(RuntimeError, match="kLEADER"):
        trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig())
    missing = trt.ParallelConfig(communication_mode=trt.CommunicationMode.ORCHESTRATOR,
                                 orchestrator_config=trt.OrchestratorConfig(worker_executable_path="/nowhere"))
    with pytest.raises(RuntimeError, match="executorWorker"):
        trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(parallel_config=missing))


def test_shutdown_releases_a_waiter_and_closes_the_executor(trt, folder):
    executor = trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig())
    outcome = []

    def wait():
        try:
            outcome.append(executor.await_responses(timeout=timedelta(hours=1)))
        except RuntimeError as exc:  # shut down before it began waiting
            outcome.append(str(exc))

    waiter = threading.Thread(target=wait)
    waiter.start()
    executor.shutdown()
    waiter.join(timeout=60)  # an hour-long wait must end with the shutdown
    assert not waiter.is_alive()
    assert outcome in ([[]], ["Shutdown called"])
    assert executor.can_enqueue_requests() is False
    for call in (lambda: executor.enqueue_request(request(trt)), lambda: executor.await_responses(timeout=WAIT),
                 executor.get_latest_iteration_stats):
        with pytest.raises(RuntimeError, match="Shutdown called"):
            call()
