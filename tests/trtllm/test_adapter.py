"""The trtllm adapter in-process, on the test double of TensorRT-LLM's bindings: the Executor's configuration,
requests, responses, stats, engine compatibility, and a model's life from load to shutdown."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer

from orchestrator.backends.options import SYSTEM_PROMPT_PRIORITY, parse_options
from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.backends.trtllm.backend import TrtllmBackend, _Running
from orchestrator.backends.trtllm.config import FREE_MEMORY_CAP, build_executor_config
from orchestrator.backends.trtllm.requests import RequestBuilder, engine_priority
from orchestrator.backends.trtllm.responses import ResponseReader, cached_prompt_tokens
from orchestrator.backends.trtllm.runtime import Runtime, check_engine_matches_runtime, load_runtime
from orchestrator.backends.trtllm.stats import IterationStatsReader
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams, TokenDelta
from orchestrator.errors import BackendUnavailable, EngineError, ModelUnavailable, QueueFull
from orchestrator.visible_gpus import Gpu
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.trtllm.conftest import DOUBLES, make_trtllm_engine

H100 = Gpu(0, "NVIDIA H100 80GB HBM3", 9, 0)
VOCAB = 49152  # SmolLM2's, which the test engines take


@pytest.fixture(scope="module")
def trt(doubles_on_path):
    return importlib.import_module("tensorrt_llm.bindings.executor")


@pytest.fixture(scope="module")
def runtime(trt) -> Runtime:
    return Runtime(bindings=trt, version="1.2.1", package_dir=DOUBLES / "tensorrt_llm")


@pytest.fixture(scope="module")
def engines(default_engine, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("adapter")
    make_trtllm_engine(default_engine, folder, "one-gpu")
    make_trtllm_engine(default_engine, folder, "two-gpus", tp=2)
    return folder


def settings_for(folder: Path, kv_cache_bytes: int | None = None, **options) -> BackendSettings:
    """`options` as the trtllm backend's section (parse_options refuses a wrong one, naming the field)."""
    manifest = load_manifest(folder)
    budget = kv_cache_bytes or manifest.kv_cache.default_budget_bytes
    return BackendSettings(folder, manifest, budget, parse_options(manifest.backend, options))


# -- the Executor's configuration -------------------------------------------------------------------------------
def test_executor_config_sizes_the_kv_cache_by_the_assigned_bytes(trt, runtime, engines):
    settings = settings_for(engines / "one-gpu", kv_cache_bytes=100 * 32 * 23040 + 5)  # 100 blocks and a bit
    config = build_executor_config(trt, settings, runtime)
    kv = config.kv_cache_config
    assert kv.max_tokens == 100 * 32
    assert kv.max_gpu_total_bytes == 0  # not read on the engine path: max_tokens carries the budget
    assert kv.free_gpu_memory_fraction == FREE_MEMORY_CAP  # set, never left to the implicit default
    assert kv.enable_block_reuse is True


def test_the_host_kv_tier_is_the_models_prompt_cache_bytes(trt, runtime, engines):
    tiered = build_executor_config(trt, settings_for(engines / "one-gpu", prompt_cache_bytes=8 * 2**30), runtime)
    assert tiered.kv_cache_config.host_cache_size == 8 * 2**30
    assert tiered.kv_cache_config.onboard_blocks is True  # offloaded blocks come back when reused
    for off in ({}, {"prompt_cache_bytes": 0}):
        config = build_executor_config(trt, settings_for(engines / "one-gpu", **off), runtime)
        assert config.kv_cache_config.host_cache_size is None


def test_executor_config_batches_in_flight_with_chunked_prefill_and_stats(trt, runtime, engines):
    settings = settings_for(engines / "one-gpu")
    config = build_executor_config(trt, settings, runtime)
    limits = settings.manifest.limits
    assert config.enable_chunked_context is True
    assert config.batching_type is trt.BatchingType.INFLIGHT
    assert config.iter_stats_max_iterations > 0
    assert (config.max_batch_size, config.max_num_tokens) == (limits.max_batch_size, limits.max_num_tokens)
    assert config.max_queue_size >= limits.max_batch_size
    assert config.parallel_config is None
    assert vars(config) == {k: v for k, v in vars(config).items() if k.startswith("_")}  # no stray attributes


@pytest.mark.parametrize(("policy", "member"), [("guaranteed_no_evict", "GUARANTEED_NO_EVICT"),
                                                ("max_utilization", "MAX_UTILIZATION")])
def test_capacity_policy_comes_from_the_settings(trt, runtime, engines, policy, member):
    config = build_executor_config(trt, settings_for(engines / "one-gpu", capacity_policy=policy), runtime)
    assert config.scheduler_config.capacity_scheduler_policy is trt.CapacitySchedulerPolicy[member]


def test_an_unknown_capacity_policy_or_a_budget_below_one_block_is_refused(trt, runtime, engines):
    with pytest.raises(ModelUnavailable, match="capacity_policy"):
        build_executor_config(trt, settings_for(engines / "one-gpu", capacity_policy="fifo"), runtime)
    with pytest.raises(ModelUnavailable, match="holds no block"):
        build_executor_config(trt, settings_for(engines / "one-gpu", kv_cache_bytes=1000), runtime)


def test_a_multi_gpu_engine_runs_in_orchestrator_mode(trt, runtime, engines):
    settings = settings_for(engines / "two-gpus", kv_cache_bytes=10 * 32 * 23040)
    config = build_executor_config(trt, settings, runtime)
    parallel = config.parallel_config
    assert parallel.communication_mode is trt.CommunicationMode.ORCHESTRATOR
    assert parallel.orchestrator_config.is_orchestrator is True
    assert parallel.orchestrator_config.worker_executable_path == str(runtime.worker_executable)
    assert config.kv_cache_config.max_tokens == 10 * 32


def test_orchestrator_mode_without_the_worker_binary_is_refused(trt, engines, tmp_path):
    runtime = Runtime(bindings=trt, version="1.2.1", package_dir=tmp_path)
    with pytest.raises(BackendUnavailable, match="executorWorker"):
        build_executor_config(trt, settings_for(engines / "two-gpus"), runtime)


# -- requests ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def builder(trt, engines) -> RequestBuilder:
    folder = engines / "one-gpu"
    manifest = load_manifest(folder)
    extra_eos = manifest.model_copy(
        update={"tokenizer": manifest.tokenizer.model_copy(update={"eos_token_ids": (2, 0)})}
    )
    return RequestBuilder(trt, extra_eos, Tokenizer.from_file(str(folder / "tokenizer.json")), VOCAB)


def test_a_request_streams_new_tokens_with_end_and_pad_ids(trt, builder):
    request = builder.build(EngineRequest("r", (5, 6, 7), max_new_tokens=9, logprobs=True))
    assert (request.input_token_ids, request.max_tokens, request.streaming) == ([5, 6, 7], 9, True)
    assert (request.end_id, request.pad_id) == (2, 2)
    assert request.output_config.exclude_input_from_output is True
    assert request.output_config.return_log_probs is True
    assert request.stop_words == [[0]]  # the second end token stops it too


def test_exact_stop_strings_become_stop_words_and_others_stay_text_only(builder):
    request = builder.build(EngineRequest("r", (5,), 9, stop=(" dragon", ", 4", "<|im_end|>", "")))
    tokenizer = builder._stop_words._tokenizer
    assert request.stop_words == [[0], tokenizer.encode(" dragon").ids, tokenizer.encode(", 4").ids]


def test_sampling_maps_greedy_to_top_k_1_and_passes_the_rest(builder):
    greedy = builder.build(EngineRequest("g", (5,), 9, SamplingParams(temperature=0.0, presence_penalty=0.5)))
    assert (greedy.sampling_config.top_k, greedy.sampling_config.temperature) == (1, None)
    assert (greedy.sampling_config.min_tokens, greedy.sampling_config.repetition_penalty) == (None, None)
    assert greedy.sampling_config.presence_penalty == 0.5
    sampled = builder.build(EngineRequest("s", (5,), 9, SamplingParams(0.7, 0.9, 40, seed=11, frequency_penalty=0.3)))
    config = sampled.sampling_config
    assert (config.temperature, config.top_p, config.top_k, config.seed) == (pytest.approx(0.7), pytest.approx(0.9), 40, 11)
    assert (config.frequency_penalty, config.presence_penalty) == (pytest.approx(0.3), None)
    assert builder.build(EngineRequest("a", (5,), 9, SamplingParams(1.0))).sampling_config.top_p == 1.0


def test_ignore_eos_is_an_end_id_no_token_matches_and_drops_the_extra_end_tokens(builder):
    request = builder.build(EngineRequest("r", (5,), 9, ignore_eos=True, stop_token_ids=(7,)))
    assert request.end_id == -1  # as TensorRT-LLM's LLM API does for ignore_eos
    assert request.stop_words == [[7]]  # the request's own stop tokens still end it


def test_stop_token_ids_are_one_token_stop_words(builder):
    assert builder.build(EngineRequest("r", (5,), 9, stop_token_ids=(9, 7))).stop_words == [[0], [7], [9]]


def test_min_tokens_reaches_the_engine_and_keeps_end_tokens_for_the_backend(builder):
    request = EngineRequest("r", (5,), 9, stop_token_ids=(7,), min_tokens=4, stop=(" dragon",))
    built = builder.build(request)
    assert built.sampling_config.min_tokens == 4
    assert built.stop_words is None  # the engine's min_tokens holds back end_id only
    assert builder.end_tokens(request) == frozenset({0, 7})


def test_penalties_min_p_and_logit_bias_reach_the_engine(builder):
    sampling = SamplingParams(0.8, 0.9, 0, seed=3, repetition_penalty=1.3, min_p=0.05, logit_bias=((11, 5.0), (12, -100.0)))
    built = builder.build(EngineRequest("r", (5,), 9, sampling))
    assert built.sampling_config.repetition_penalty == pytest.approx(1.3)
    assert built.sampling_config.min_p == pytest.approx(0.05)
    bias = built.embedding_bias
    assert (tuple(bias.shape), str(bias.dtype)) == ((VOCAB,), "torch.float32")
    assert (bias[11].item(), bias[12].item(), float(bias.abs().sum())) == (5.0, -100.0, 105.0)
    assert builder.build(EngineRequest("r", (5,), 9)).embedding_bias is None


def test_every_request_asks_for_perf_metrics(builder):
    """They carry the count of prompt blocks found in the prefix cache (usage's cached_tokens)."""
    assert builder.build(EngineRequest("r", (5,), 9)).output_config.return_perf_metrics is True


def test_top_logprobs_ask_for_generation_logits(builder):
    assert builder.build(EngineRequest("r", (5,), 9, logprobs=True, top_logprobs=3)).output_config.return_generation_logits
    assert not builder.build(EngineRequest("r", (5,), 9, logprobs=True)).output_config.return_generation_logits


def test_the_system_prompt_is_kept_at_high_priority_where_the_model_says_so(trt, engines):
    folder = engines / "one-gpu"
    retaining = RequestBuilder(trt, load_manifest(folder), Tokenizer.from_file(str(folder / "tokenizer.json")), VOCAB,
                               retain_system_prompt=True)
    built = retaining.build(EngineRequest("r", tuple(range(5, 105)), 8, system_prefix_tokens=40))
    config = built.kv_cache_retention_config
    (kept,) = config.token_range_retention_configs
    assert (kept.token_start, kept.token_end, kept.priority, kept.duration_ms) == (0, 40, SYSTEM_PROMPT_PRIORITY, None)
    assert config.decode_retention_priority == 35  # the generated tokens keep the engine's default
    assert retaining.build(EngineRequest("r", (5, 6, 7), 8)).kv_cache_retention_config is None  # nothing to keep


def test_without_the_setting_no_request_carries_a_retention_config(builder):
    built = builder.build(EngineRequest("r", tuple(range(5, 105)), 8, system_prefix_tokens=40))
    assert built.kv_cache_retention_config is None


def test_the_double_refuses_retention_configs_the_engine_refuses(trt):
    """As the 1.2 constructors check: a priority outside 0..100, overlapping ranges, an open range before another."""
    ranges = trt.KvCacheRetentionConfig.TokenRangeRetentionConfig
    with pytest.raises(RuntimeError, match="priority"):
        ranges(0, 10, 101)
    with pytest.raises(ValueError, match="non-overlapping"):
        trt.KvCacheRetentionConfig([ranges(0, 64, 90), ranges(60, 80, 50)])
    with pytest.raises(ValueError, match="end indicator"):
        trt.KvCacheRetentionConfig([ranges(0, None, 90), ranges(30, 50, 50)])
    with pytest.raises(TypeError):
        ranges(token_start=0, token_end=10)  # priority has no default in the binding


def test_priority_keeps_the_order_inside_the_engines_range():
    priorities = [-10_000, -100, -8, -1, 0, 1, 8, 100, 10_000]
    mapped = [engine_priority(p) for p in priorities]
    assert mapped == sorted(mapped) and len(set(mapped)) == len(mapped)
    assert all(0.0 < m < 1.0 for m in mapped)
    assert engine_priority(0) == 0.5  # TensorRT-LLM's default


# -- responses --------------------------------------------------------------------------------------------------
def response(trt, tokens, final=False, reason="NOT_FINISHED", log_probs=None, error=None, reused_blocks=None):
    result = trt.Result()
    result.is_final, result.output_token_ids = final, [list(tokens)]
    result.finish_reasons = [trt.FinishReason[reason]]
    result.log_probs = log_probs
    if reused_blocks is not None:
        result.request_perf_metrics = trt.RequestPerfMetrics()
        result.request_perf_metrics.kv_cache_metrics.num_reused_blocks = reused_blocks
    return trt.Response(3, error) if error else trt.Response(3, result)


def test_responses_become_token_deltas(trt):
    reader = ResponseReader(trt, (2, 0))
    update = reader.read(response(trt, [11, 12], log_probs=[[-0.1, -0.2, -0.3]]))
    assert (update.request_id, update.final, update.delta.token_ids) == (3, False, [11, 12])
    assert update.delta.logprobs == [-0.2, -0.3]  # the newest tokens' share of the cumulative list
    error = reader.read(response(trt, [], error="the engine broke"))
    assert (error.final, error.delta.finish) == (True, FinishReason.ERROR)
    assert isinstance(error.delta.error, EngineError) and "the engine broke" in error.delta.error.message
    full = reader.read(response(trt, [], error="Maximum queue size of 8 has been reached, please try again later"))
    assert isinstance(full.delta.error, QueueFull) and full.delta.error.retry_after_s  # retryable, as enqueue's


@pytest.mark.parametrize(("reason", "tokens", "finish", "kept"), [
    ("END_ID", [11, 2], FinishReason.STOP, [11]),
    ("STOP_WORDS", [11, 0], FinishReason.STOP, [11]),  # an extra end token used as a stop word
    ("STOP_WORDS", [11, 12], FinishReason.STOP, [11, 12]),  # a stop string's tokens: the worker cuts the text
    ("LENGTH", [11, 2], FinishReason.LENGTH, [11, 2]),
    ("TIMED_OUT", [11], FinishReason.LENGTH, [11]),
    ("CANCELLED", [], FinishReason.CANCELLED, []),
    ("NOT_FINISHED", [11, 2], FinishReason.STOP, [11]),
    ("NOT_FINISHED", [11], FinishReason.LENGTH, [11]),
])
def test_finish_reasons_map_to_the_protocol(trt, reason, tokens, finish, kept):
    update = ResponseReader(trt, (2, 0)).read(response(trt, tokens, final=True, reason=reason))
    assert (update.final, update.delta.finish, update.delta.token_ids) == (True, finish, kept)


# -- cached prompt tokens ---------------------------------------------------------------------------------------
def test_a_requests_first_result_gives_the_reused_blocks_and_none_means_unknown(trt):
    reader = ResponseReader(trt, (2, 0))
    stream = [response(trt, [11], reused_blocks=3), response(trt, [12], reused_blocks=3),
              response(trt, [13], final=True, reason="LENGTH", reused_blocks=3)]
    assert [reader.read(r).reused_blocks for r in stream] == [3, None, None]  # read once per request
    assert reader.read(response(trt, [11], final=True, reason="LENGTH", reused_blocks=0)).reused_blocks == 0
    assert reader.read(response(trt, [11])).reused_blocks is None  # no perf metrics: unknown, not 0
    reader.read(response(trt, [], error="the engine broke"))  # an error ends the request too
    assert reader._counted == set()


@pytest.mark.parametrize(("reused", "prompt_len", "cached"), [
    (0, 70, 0),
    (1, 70, 32),
    (2, 70, 64),
    (3, 70, 69),  # every block: all but the last prompt token, which the engine always computes again
    (2, 64, 63),
    (2, 65, 64),
    (1, 1, 0),
])
def test_cached_prompt_tokens_are_reused_blocks_up_to_all_but_the_last_prompt_token(reused, prompt_len, cached):
    assert cached_prompt_tokens(reused, 32, prompt_len) == cached


def test_the_cached_tokens_go_once_on_the_first_delta_sent_after_the_count():
    running = _Running("r", EngineRequest("r", tuple(range(100, 170)), 8), frozenset())
    deltas = [TokenDelta("r", [token]) for token in (1, 2, 3)]
    running.report_cached(deltas[0], 32)  # no count yet (a result without perf metrics): nothing said
    running.note_reused(2)  # from a result whose delta was not sent
    running.note_reused(None)
    running.report_cached(deltas[1], 32)
    running.report_cached(deltas[2], 32)
    assert [d.cached_tokens for d in deltas] == [None, 64, None]


def test_a_prompt_seen_before_reports_its_cached_tokens_on_its_first_delta(trt, runtime, engines):
    """Through the backend on the double's prefix reuse (tokens_per_block 32): a new prompt 0; the same prompt
    again all but its last token; a prompt sharing 40 tokens two blocks, the second matched on 8 tokens only."""
    prompt = tuple(range(300, 370))

    async def life():
        backend = TrtllmBackend(settings_for(engines / "one-gpu"), runtime)
        streams = await started(backend)
        cached = {}
        for name, ids in (("new", prompt), ("again", prompt), ("shares", prompt[:40] + tuple(range(500, 530)))):
            deltas = await drain(streams.stream(EngineRequest(name, ids, 4)))
            cached[name] = [d.cached_tokens for d in deltas]
        await backend.close()
        return cached

    cached = run(life())
    assert cached == {"new": [0, None, None, None], "again": [69, None, None, None], "shares": [64, None, None, None]}


def test_blocks_are_reused_only_between_requests_of_one_cache_salt(trt, runtime, engines, builder):
    """The salt goes to the engine as cache_salt_id (None for the anonymous salt), and the double, like 1.2's
    block keys, matches blocks only within equal salt ids."""
    prompt = tuple(range(300, 370))
    assert builder.build(EngineRequest("r", prompt, 4)).cache_salt_id is None
    assert builder.build(EngineRequest("r", prompt, 4, cache_salt="00ff" * 8)).cache_salt_id == 0x00FF00FF00FF00FF

    async def life():
        backend = TrtllmBackend(settings_for(engines / "one-gpu"), runtime)
        streams = await started(backend)
        cached = {}
        for name, salt in (("alice", "a1" * 16), ("bob", "b2" * 16), ("anonymous", ""), ("alice again", "a1" * 16)):
            deltas = await drain(streams.stream(EngineRequest(name, prompt, 4, cache_salt=salt)))
            cached[name] = deltas[0].cached_tokens
        await backend.close()
        return cached

    assert run(life()) == {"alice": 0, "bob": 0, "anonymous": 0, "alice again": 69}

# -- stats ------------------------------------------------------------------------------------------------------
def entry(active, latency, used=None, queued=0, iteration=1):
    kv = None if used is None else SimpleNamespace(max_num_blocks=10, free_num_blocks=10 - used, used_num_blocks=used,
                                                   tokens_per_block=64, reused_blocks=3)
    return SimpleNamespace(num_active_requests=active, num_queued_requests=queued, iter=iteration,
                           iter_latency_ms=latency, kv_cache_stats=kv)


def test_stats_keep_the_newest_entry_and_the_last_busy_steps_latency():
    reader = IterationStatsReader(kv_blocks=7, tokens_per_block=32)
    assert (reader.current.kv_blocks_total, reader.current.running) == (7, 0)  # before the first step
    stats = reader.read([entry(2, 12.5, used=4, queued=1, iteration=8), entry(0, 0.0, used=0, iteration=9)])
    assert (stats.running, stats.waiting, stats.iterations) == (0, 0, 9)
    assert (stats.kv_blocks_total, stats.kv_blocks_free, stats.kv_blocks_used) == (10, 10, 0)
    assert (stats.tokens_per_block, stats.kv_blocks_reused, stats.iteration_latency_ms) == (64, 3, 12.5)
    assert reader.read([]) == stats
    assert reader.read([entry(1, 4.0, iteration=10)]).kv_blocks_total == 10  # no KV stats in an entry: kept


# -- will the engine run here ------------------------------------------------------------------------------------
def test_an_engine_built_for_this_version_and_gpu_is_accepted(engines):
    manifest = load_manifest(engines / "one-gpu")
    check_engine_matches_runtime(manifest, engines / "one-gpu", "1.2.1", [H100])
    check_engine_matches_runtime(manifest, engines / "one-gpu", "1.2.1", None)  # no NVML: left to TensorRT


@pytest.mark.parametrize(("version", "gpus", "reason"), [
    ("1.2.0", [H100], "built with TensorRT-LLM 1.2.1, but this server runs TensorRT-LLM 1.2.0"),
    ("1.2.1", [Gpu(0, "NVIDIA A100-SXM4-80GB", 8, 0)], "built for sm90 (compute capability 9.0), but GPU 0"),
    ("1.2.1", [], "needs 1 GPU(s)"),
])
def test_an_engine_for_another_version_or_gpu_is_refused_with_the_rebuild_command(engines, version, gpus, reason):
    with pytest.raises(ModelUnavailable) as caught:
        check_engine_matches_runtime(load_manifest(engines / "one-gpu"), engines / "one-gpu", version, gpus)
    assert reason in caught.value.message
    assert "make build-engine MODEL=one-gpu" in caught.value.message


def test_the_architecture_is_read_from_target_arch_when_the_capability_is_missing(engines):
    manifest = load_manifest(engines / "one-gpu")
    arch_only = manifest.model_copy(update={"build": manifest.build.model_copy(update={"compute_capability": None})})
    check_engine_matches_runtime(arch_only, engines / "one-gpu", "1.2.1", [H100])
    with pytest.raises(ModelUnavailable, match="sm89"):
        check_engine_matches_runtime(arch_only, engines / "one-gpu", "1.2.1", [Gpu(0, "NVIDIA L40S", 8, 9)])


def test_a_manifest_without_the_tensorrt_llm_version_is_refused(engines):
    manifest = load_manifest(engines / "one-gpu")
    unversioned = manifest.model_copy(update={"build": manifest.build.model_copy(update={"tools": {}})})
    with pytest.raises(ModelUnavailable, match="does not record which TensorRT-LLM"):
        check_engine_matches_runtime(unversioned, engines / "one-gpu", "1.2.1", [H100])


def test_the_runtime_is_tensorrt_llm_1_2(doubles_on_path, monkeypatch):
    runtime = load_runtime()
    assert runtime.version == "1.2.1"
    assert runtime.worker_executable.is_file()
    monkeypatch.setattr(sys.modules["tensorrt_llm"], "__version__", "1.3.0rc1")
    with pytest.raises(BackendUnavailable, match=r"1\.2\.x .*1\.3\.0rc1 is installed"):
        load_runtime()


def test_without_tensorrt_llm_the_load_fails_naming_the_version_and_where_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # what `import` sees when it is not installed
    with pytest.raises(BackendUnavailable) as caught:
        load_runtime()
    message = caught.value.message
    assert "TensorRT-LLM 1.2.1" in message and "pypi.nvidia.com" in message
    assert "nvcr.io/nvidia/tensorrt-llm/release:1.2.1" in message


# -- a model's life ---------------------------------------------------------------------------------------------
def run(coroutine):
    return asyncio.run(coroutine)


async def drain(stream) -> list:
    return [delta async for delta in stream]


async def started(backend) -> RequestStreams:
    """Start the backend with its output going to one stream per request."""
    streams = RequestStreams(backend)
    await backend.start(streams)
    return streams


async def eventually(condition, timeout: float = 30.0) -> None:
    """Await `condition()` becoming true, checking every 10 ms; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out waiting for the condition"
        await asyncio.sleep(0.01)


def test_load_generate_cancel_and_shut_down(trt, runtime, engines):
    settings = settings_for(engines / "one-gpu")
    prompt = tuple(range(300, 320))

    async def life():
        backend = TrtllmBackend(settings, runtime)
        streams = RequestStreams(backend)
        report = await backend.start(streams)
        stats = backend.stats()  # the warm-up's steps report the cache the engine really allocated
        expected_blocks = settings.kv_cache_bytes // (32 * 23040)
        assert (stats.kv_blocks_total, stats.tokens_per_block, report.device) == (expected_blocks, 32, "cuda:0")

        deltas = await drain(streams.stream(EngineRequest("a", prompt, 6, logprobs=True)))
        assert [t for d in deltas for t in d.token_ids] == list(prompt[:6])  # greedy: the double repeats the prompt
        assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
        assert deltas[-1].finish is FinishReason.LENGTH

        seen = []
        async for delta in streams.stream(EngineRequest("b", prompt, 10_000)):
            seen.append(delta)
            backend.cancel("b")
        assert seen[-1].finish is FinishReason.CANCELLED and seen[-1].token_ids == []

        executor = backend._executor
        await backend.close()
        assert executor.can_enqueue_requests() is False
        assert not backend._pump._thread.is_alive()
        assert backend.stats().running == 0  # after shutdown: the last view, without touching the executor

    run(life())


def test_a_stream_abandoned_midway_is_cancelled_in_the_engine(trt, runtime, engines):
    async def life():
        backend = TrtllmBackend(settings_for(engines / "one-gpu"), runtime)
        streams = await started(backend)
        stream = streams.stream(EngineRequest("left", tuple(range(300, 320)), 10_000))
        await anext(stream)
        assert backend.stats().running == 1
        await stream.aclose()  # the consumer goes away without cancelling
        await eventually(lambda: backend.stats().running == 0)
        assert backend._running == {} and backend._ids == {}
        await backend.close()

    run(life())


def test_responses_reach_the_event_loop_one_batch_per_step_not_one_call_per_token(trt, runtime, engines):
    async def life():
        backend = TrtllmBackend(settings_for(engines / "one-gpu"), runtime)
        streams = await started(backend)
        batches = []
        deliver = backend._deliver
        backend._pump._deliver = lambda updates: (batches.append(len(updates)), deliver(updates))
        requests = [EngineRequest(f"r{i}", tuple(range(300, 320)), 12) for i in range(4)]
        await asyncio.gather(*(drain(streams.stream(r)) for r in requests))
        await backend.close()
        return batches

    batches = run(life())
    assert sum(batches) == 4 * 12
    assert max(batches) >= 2  # requests running together come back together


def test_an_engine_error_response_ends_the_stream_with_the_error(trt, runtime, default_engine, tmp_path):
    folder = make_trtllm_engine(default_engine, tmp_path, "faulty", plan={"fail_after_tokens": 3})

    async def life():
        backend = TrtllmBackend(settings_for(folder), runtime)
        streams = await started(backend)  # the warm-up's 2 tokens stay below the fault
        deltas = await drain(streams.stream(EngineRequest("x", tuple(range(300, 320)), 50)))
        later = await drain(streams.stream(EngineRequest("y", tuple(range(300, 320)), 2)))
        await backend.close()
        return deltas, later

    deltas, later = run(life())
    assert [t for d in deltas for t in d.token_ids] == [300, 301]
    assert deltas[-1].finish is FinishReason.ERROR and "forwardAsync" in deltas[-1].error.message
    assert later[-1].finish is FinishReason.LENGTH  # the executor goes on serving


def test_the_request_fields_change_what_the_engine_generates(trt, runtime, default_engine, tmp_path):
    """ignore_eos, min_tokens with a stop token, logit_bias and top_logprobs, through the adapter and the double
    (whose model repeats the prompt, so the effect of each field is exact)."""
    manifest = json.loads((default_engine / "engine.json").read_text())
    folder = make_trtllm_engine(default_engine, tmp_path, "logits")  # no build flag: a runtime setting in 1.2
    end = manifest["tokenizer"]["eos_token_ids"][0]
    prompt = (300, 301, end, 302)  # the end token comes third

    async def life():
        backend = TrtllmBackend(settings_for(folder, generation_logits=True), runtime)
        streams = await started(backend)
        runs = {
            "plain": EngineRequest("plain", prompt, 8),
            "ignore_eos": EngineRequest("ignore_eos", prompt, 8, ignore_eos=True),
            "min_tokens": EngineRequest("min_tokens", prompt, 8, min_tokens=4, stop_token_ids=(301,)),
            "bias": EngineRequest("bias", prompt, 3, SamplingParams(0.0, logit_bias=((777, 100.0),))),
            "top": EngineRequest("top", prompt, 2, logprobs=True, top_logprobs=3),
        }
        outcome = {name: await streams.run(request) for name, request in runs.items()}
        await backend.close()
        return outcome

    outcome = run(life())
    tokens = {name: [t for d in deltas for t in d.token_ids] for name, deltas in outcome.items()}
    finish = {name: deltas[-1].finish for name, deltas in outcome.items()}
    assert (tokens["plain"], finish["plain"]) == ([300, 301], FinishReason.STOP)
    assert (tokens["ignore_eos"], finish["ignore_eos"]) == ([300, 301, end, 302, 300, 301, end, 302], FinishReason.LENGTH)
    # min_tokens 4 holds back the end token and the stop token 301 up to the 4th token; then 301 ends it
    assert (tokens["min_tokens"], finish["min_tokens"]) == ([300, 301, 302, 300], FinishReason.STOP)
    assert tokens["bias"] == [777, 777, 777]  # +100 outweighs the model's preference
    top = [alternatives for d in outcome["top"] for alternatives in d.top_logprobs or []]
    assert [[t for t, _ in alternatives] for alternatives in top] == [[300, 301, end], [301, end, 302]]
    assert all(a[0][1] > a[1][1] > a[2][1] for a in top)  # best first
    chosen = [lp for d in outcome["top"] for lp in d.logprobs]
    assert chosen == [a[0][1] for a in top]  # greedy: the chosen token is the most likely


def test_closing_cancels_live_requests_because_shutdown_drains(trt, runtime, engines):
    async def life():
        backend = TrtllmBackend(settings_for(engines / "one-gpu"), runtime)
        streams = await started(backend)
        stream = streams.stream(EngineRequest("long", tuple(range(300, 320)), 10_000))
        await anext(stream)
        engine = backend._executor._engine
        await backend.close()
        return engine

    engine = run(life())
    assert list(engine.finish_reasons.values())[-1] == "CANCELLED"  # not drained to its 10,000th token


@pytest.mark.parametrize(("visible", "expected"), [
    (None, ["A100", "H100", "L40S"]),
    ("1,0", ["H100", "A100"]),
    ("GPU-l40s,1", ["L40S", "H100"]),
    ("1,-1,0", ["H100"]),  # CUDA stops at the first entry it cannot read
    ("", []),
])
def test_gpus_are_read_in_the_order_cuda_numbers_them(monkeypatch, visible, expected):
    from orchestrator.backends.trtllm.runtime import visible_gpus

    nvml = FakeNvml([FakeGpu("GPU-a100", "A100", (8, 0)), FakeGpu("GPU-h100", "H100", (9, 0)),
                     FakeGpu("GPU-l40s", "L40S", (8, 9))])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus = visible_gpus()
    assert [gpu.name for gpu in gpus] == expected
    assert [gpu.index for gpu in gpus] == list(range(len(expected)))
    assert nvml.open is False
    if expected[:1] == ["H100"]:
        assert (gpus[0].compute_capability, gpus[0].arch) == ("9.0", "sm90")
