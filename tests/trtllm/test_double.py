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
    assert all(p == 0.0 for p in responses[-1].result.log_probs[0])  # greedy, normalised over the top-1 set


# -- perf metrics and prefix reuse -----------------------------------------------------------------------------
BLOCK = 32  # the test engine's tokens_per_block
LONG = list(range(1000, 1064))  # two blocks


def with_perf(trt, prompt, max_tokens=2, **kwargs):
    output = trt.OutputConfig(exclude_input_from_output=True, return_perf_metrics=True)
    return request(trt, prompt, max_tokens, output_config=output, **kwargs)


def kv_metrics(executor, req):
    """The kv_cache_metrics of a request's first result (they do not change after it)."""
    return collect(executor, executor.enqueue_request(req))[0].result.request_perf_metrics.kv_cache_metrics


def test_perf_metrics_come_on_every_result_only_when_asked(trt, executor):
    asked = collect(executor, executor.enqueue_request(with_perf(trt, PROMPT, max_tokens=3)))
    metrics = [r.result.request_perf_metrics for r in asked]
    assert len(metrics) == 3 and all(isinstance(m, trt.RequestPerfMetrics) for m in metrics)
    assert len({id(m) for m in metrics}) == 3  # each result holds its own copy
    assert [m.last_iter is None for m in metrics] == [True, True, False]  # set when the request finishes
    assert metrics[0].first_iter == metrics[-1].first_iter and metrics[-1].last_iter == metrics[-1].iter
    timing = metrics[-1].timing_metrics
    assert timing.arrival_time <= timing.first_scheduled_time <= timing.first_token_time <= timing.last_token_time
    kv = metrics[0].kv_cache_metrics
    assert (kv.num_reused_blocks, kv.num_missed_blocks, kv.kv_cache_hit_rate) == (0, 1, 0.0)  # 5 tokens: 1 block
    plain = collect(executor, executor.enqueue_request(request(trt, PROMPT, max_tokens=2)))
    assert all(r.result.request_perf_metrics is None for r in plain)


def test_a_prompt_seen_before_reuses_every_block_but_never_its_last_token(trt, executor):
    first = kv_metrics(executor, with_perf(trt, LONG))
    assert (first.num_reused_blocks, first.num_missed_blocks, first.num_total_allocated_blocks) == (0, 2, 2)
    again = kv_metrics(executor, with_perf(trt, LONG))  # 63 tokens matched: a full block, then 31 of the next
    assert (again.num_reused_blocks, again.num_missed_blocks, again.kv_cache_hit_rate) == (2, 0, 1.0)
    one_more = kv_metrics(executor, with_perf(trt, LONG[:BLOCK + 1]))  # its last token alone in the second block
    assert (one_more.num_reused_blocks, one_more.num_missed_blocks) == (1, 1)


def test_a_partly_matching_block_counts_as_reused_and_ends_the_match(trt, executor):
    kv_metrics(executor, with_perf(trt, LONG))
    shares_40 = kv_metrics(executor, with_perf(trt, LONG[:40] + list(range(2000, 2024))))
    assert (shares_40.num_reused_blocks, shares_40.num_missed_blocks) == (2, 0)  # the second block on 8 tokens
    shares_32 = kv_metrics(executor, with_perf(trt, LONG[:BLOCK] + list(range(3000, 3032))))
    assert (shares_32.num_reused_blocks, shares_32.num_missed_blocks) == (1, 1)


def test_without_partial_reuse_only_whole_blocks_match(trt, folder):
    kv = trt.KvCacheConfig(enable_partial_reuse=False)
    with trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(kv_cache_config=kv)) as executor:
        kv_metrics(executor, with_perf(trt, LONG))
        shares_40 = kv_metrics(executor, with_perf(trt, LONG[:40] + list(range(2000, 2024))))
        assert (shares_40.num_reused_blocks, shares_40.num_missed_blocks) == (1, 1)


def test_without_block_reuse_nothing_is_reused_or_missed(trt, folder):
    kv = trt.KvCacheConfig(enable_block_reuse=False)
    with trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(kv_cache_config=kv)) as executor:
        kv_metrics(executor, with_perf(trt, LONG))
        again = kv_metrics(executor, with_perf(trt, LONG))
        assert (again.num_reused_blocks, again.num_missed_blocks, again.num_total_allocated_blocks) == (0, 0, 2)


def test_requests_computed_in_the_same_step_do_not_reuse_each_other(trt, executor):
    ids = executor.enqueue_requests([with_perf(trt, LONG), with_perf(trt, LONG)])
    firsts = {}
    while len(firsts) < 2:
        for response in executor.await_responses(timeout=WAIT):
            firsts.setdefault(response.request_id, response.result.request_perf_metrics.kv_cache_metrics)
    assert [firsts[i].num_reused_blocks for i in ids] == [0, 0]  # blocks become reusable once a context is done
    for i in ids:
        executor.cancel_request(i)


def test_a_running_requests_context_blocks_are_reusable_before_it_ends(trt, executor):
    running = executor.enqueue_request(with_perf(trt, LONG, max_tokens=10_000))
    executor.await_responses(running, timeout=WAIT)  # its context phase is done
    later = kv_metrics(executor, with_perf(trt, LONG))
    assert later.num_reused_blocks >= 1  # the full first block at least, stored after the context phase
    executor.cancel_request(running)
    collect(executor, running)


def test_copy_on_partial_reuse_off_is_refused_by_the_double(trt, folder):
    kv = trt.KvCacheConfig(copy_on_partial_reuse=False)
    with pytest.raises(RuntimeError, match="copy_on_partial_reuse"):
        trt.Executor(folder, trt.ModelType.DECODER_ONLY, trt.ExecutorConfig(kv_cache_config=kv))


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
