"""Test double of `tensorrt_llm.bindings.executor`, the Python bindings of TensorRT-LLM 1.2's C++ Executor.

For tests only: the real module cannot be installed where they run. It implements only names, signatures,
keyword-only rules and behaviours that Inferno's TensorRT-LLM 1.2 facts table documents
(tests/trtllm/tensorrt_llm_1_2_facts.toml; tests/trtllm/test_conformance.py holds it to that list):

- constructors check argument names, keyword-only rules and types, raising TypeError like nanobind does;
  read-only properties raise AttributeError when set; only ExecutorConfig accepts unknown attributes;
- KvCacheConfig sizing: the smaller of max_tokens and the free-memory fraction (0.9 when None) wins;
  max_gpu_total_bytes is accepted and not read, as on the real TensorRT engine path;
- the Executor runs its own loop in a background thread; `await_responses(timeout=timedelta)` blocks
  (releasing the GIL) until responses arrive; a streaming request's results carry only the tokens new
  since the last response; `has_error()` is a method, `error_msg` and `result` raise in the wrong state;
  `cancel_request` still produces a final response (CANCELLED); `get_latest_iteration_stats()` drains its
  buffer (an entry per step, plus one when the batch runs empty); after `shutdown()` the executor takes no
  requests and its methods raise;
- prefix reuse (with enable_block_reuse, partial reuse included) as the 1.2 KV cache manager does it, in
  tensorrt_llm/bindings/_prefix.py; a request with OutputConfig(return_perf_metrics=True) gets a
  RequestPerfMetrics on every result, whose kv_cache_metrics count its context blocks reused and missed.

How it generates tokens (its "model", in tensorrt_llm/bindings/_engine.py): it repeats the prompt. Token k
of the answer is prompt[(offset + k) % len(prompt)], offset 0 for greedy requests (top_k 1, or top_p 0 /
unset) and seed % len(prompt) for sampled ones. It honours max_tokens, end_id (not part of the output),
stop_words (part of the output), min_tokens (default 1: the first token is never end_id), end_id -1 (no
token ends the sequence: ignore_eos) and the engine's limits read from config.json. Its "logits" give the
prompt's next token 10, the two tokens after it 9 and 8, and every other token 0; a request's embedding_bias
is added before the greedy choice (so a bias of +100 forces a token, -100 bans one), and with
return_generation_logits each streamed response carries them as [tokens, beam, vocab] (reference §8) when the
executor was configured with gather_generation_logits. Result.log_probs are computed from those logits as the
sampling kernels do (reference §9): log softmax over the whole vocabulary with normalize_log_probs=False; with
the default True, minus the log of the top-k set's probability (0.0 for every token of a top_k=1 request). A
top_k above 1024 is clipped to 1024 with the engine's warning (on stderr, and in `Engine.top_k_clipped`). One
step (one token for every running request) takes 5 ms. With one GPU (leader mode) shutdown() drains, as the
real one does: it returns once every queued and active request has finished; in orchestrator mode it returns
at once and responses still due are never sent; once it has begun, new requests, cancel_request and
await_responses raise. A full queue raises at enqueue in leader mode; in orchestrator mode the request is taken
and answered with an error response ("Maximum queue size of N has been reached…").
The engine file rank0.engine may hold a JSON fault plan, {"fail_after_tokens": N}: the step in which a
request reaches N tokens fails, and every running request gets an error response, as when a real
forward pass fails; {"load_s": S}: the constructor holds the GIL for S seconds, as the real one does for the
whole engine load (reference §8), so no other thread of the worker runs meanwhile; {"guided_setup_error": "why"}:
an executor configured with guided decoding fails to load, as when xgrammar cannot read the tokenizer (§9).
"""

from __future__ import annotations

import enum
from datetime import timedelta
from os import PathLike
from pathlib import Path

from tensorrt_llm.bindings import _engine
from tensorrt_llm.bindings._results import (
    InflightBatchingStats,
    IterationStats,
    KvCacheMetrics,
    KvCacheStats,
    RequestPerfMetrics,
    Response,
    Result,
    SpeculativeDecodingMetrics,
    TimingMetrics,
)
from tensorrt_llm.bindings._types import Field as _Field
from tensorrt_llm.bindings._types import bind_overload as _bind_overload
from tensorrt_llm.bindings._types import check as _check

__all__ = [
    "BatchingType",
    "CapacitySchedulerPolicy",
    "CommunicationMode",
    "CommunicationType",
    "ContextChunkingPolicy",
    "Executor",
    "ExecutorConfig",
    "FinishReason",
    "GuidedDecodingConfig",
    "GuidedDecodingParams",
    "InflightBatchingStats",
    "IterationStats",
    "KvCacheConfig",
    "KvCacheMetrics",
    "KvCacheRetentionConfig",
    "KvCacheStats",
    "KvCacheTransferMode",
    "ModelType",
    "OrchestratorConfig",
    "OutputConfig",
    "ParallelConfig",
    "Request",
    "RequestPerfMetrics",
    "Response",
    "Result",
    "SamplingConfig",
    "SchedulerConfig",
    "SpeculativeDecodingMetrics",
    "TimingMetrics",
]


# -- enums ------------------------------------------------------------------------------------------------------
class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class ContextChunkingPolicy(enum.Enum):
    FIRST_COME_FIRST_SERVED = 0
    EQUAL_PROGRESS = 1


class BatchingType(enum.Enum):
    INFLIGHT = 1


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


# -- configuration ----------------------------------------------------------------------------------------------
class SchedulerConfig:
    __slots__ = ("_capacity_scheduler_policy", "_context_chunking_policy", "_dynamic_batch_config")
    capacity_scheduler_policy = _Field(CapacitySchedulerPolicy, readonly=True)
    context_chunking_policy = _Field(ContextChunkingPolicy, optional=True, readonly=True)
    dynamic_batch_config = _Field(object, optional=True, readonly=True)

    def __init__(
        self,
        capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
        context_chunking_policy=None,
        dynamic_batch_config=None,
    ):
        _Field.init(self, capacity_scheduler_policy=capacity_scheduler_policy,
                   context_chunking_policy=context_chunking_policy, dynamic_batch_config=dynamic_batch_config)


class KvCacheConfig:
    __slots__ = tuple(f"_{name}" for name in (
        "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length", "free_gpu_memory_fraction",
        "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction", "secondary_offload_min_priority",
        "event_buffer_max_size", "enable_partial_reuse", "copy_on_partial_reuse", "use_uvm",
        "attention_dp_events_gather_period_ms", "max_gpu_total_bytes",
    ))
    enable_block_reuse = _Field(bool)
    max_tokens = _Field(int, optional=True, minimum=1)
    max_attention_window = _Field(list, optional=True)
    sink_token_length = _Field(int, optional=True)
    free_gpu_memory_fraction = _Field(float, optional=True, minimum=0.0, maximum=1.0)
    host_cache_size = _Field(int, optional=True)
    onboard_blocks = _Field(bool)
    cross_kv_cache_fraction = _Field(float, optional=True)
    secondary_offload_min_priority = _Field(int, optional=True)
    event_buffer_max_size = _Field(int)
    enable_partial_reuse = _Field(bool)
    copy_on_partial_reuse = _Field(bool)
    use_uvm = _Field(bool)
    attention_dp_events_gather_period_ms = _Field(int)
    max_gpu_total_bytes = _Field(int, minimum=0)

    def __init__(
        self,
        enable_block_reuse=True,
        max_tokens=None,
        max_attention_window=None,
        sink_token_length=None,
        free_gpu_memory_fraction=None,
        host_cache_size=None,
        onboard_blocks=True,
        cross_kv_cache_fraction=None,
        secondary_offload_min_priority=None,
        event_buffer_max_size=0,
        *,
        enable_partial_reuse=True,
        copy_on_partial_reuse=True,
        use_uvm=False,
        attention_dp_events_gather_period_ms=5,
        runtime_defaults=None,
        max_gpu_total_bytes=0,
    ):
        if runtime_defaults is not None:
            raise TypeError("the test double does not model runtime_defaults")
        _Field.init(self, **{k: v for k, v in locals().items() if k not in ("self", "runtime_defaults")})


class OrchestratorConfig:
    __slots__ = ("_is_orchestrator", "_orch_leader_comm", "_spawn_processes", "_worker_executable_path")
    is_orchestrator = _Field(bool)
    worker_executable_path = _Field(str)
    orch_leader_comm = _Field(object, optional=True)
    spawn_processes = _Field(bool)

    def __init__(self, is_orchestrator=True, worker_executable_path="", orch_leader_comm=None, spawn_processes=True):
        _Field.init(self, is_orchestrator=is_orchestrator, worker_executable_path=worker_executable_path,
                   orch_leader_comm=orch_leader_comm, spawn_processes=spawn_processes)


class ParallelConfig:
    __slots__ = ("_communication_mode", "_communication_type", "_device_ids", "_num_nodes",
                 "_orchestrator_config", "_participant_ids")
    communication_type = _Field(CommunicationType)
    communication_mode = _Field(CommunicationMode)
    device_ids = _Field(list, optional=True)
    participant_ids = _Field(list, optional=True)
    orchestrator_config = _Field(OrchestratorConfig, optional=True)
    num_nodes = _Field(int, optional=True)

    def __init__(
        self,
        communication_type=CommunicationType.MPI,
        communication_mode=CommunicationMode.LEADER,
        device_ids=None,
        participant_ids=None,
        orchestrator_config=None,
        num_nodes=None,
    ):
        _Field.init(self, **{k: v for k, v in locals().items() if k != "self"})


class GuidedDecodingConfig:
    """Structured outputs for the executor: the grammar backend and the vocabulary it compiles grammars over."""

    class GuidedDecodingBackend(enum.Enum):
        XGRAMMAR = 0
        LLGUIDANCE = 1

    __slots__ = ("_backend", "_encoded_vocab", "_stop_token_ids", "_tokenizer_str")
    backend = _Field(GuidedDecodingBackend)
    encoded_vocab = _Field(list, optional=True, items=str)
    tokenizer_str = _Field(str, optional=True)
    stop_token_ids = _Field(list, optional=True, items=int)

    def __init__(self, backend, encoded_vocab=None, tokenizer_str=None, stop_token_ids=None):
        _Field.init(self, backend=backend, encoded_vocab=encoded_vocab, tokenizer_str=tokenizer_str,
                    stop_token_ids=stop_token_ids)


class ExecutorConfig:
    """No __slots__: like the real class (nanobind dynamic_attr), it stores any misspelled attribute."""

    max_beam_width = _Field(int, minimum=1)
    scheduler_config = _Field(SchedulerConfig)
    kv_cache_config = _Field(KvCacheConfig)
    enable_chunked_context = _Field(bool)
    normalize_log_probs = _Field(bool)
    iter_stats_max_iterations = _Field(int, minimum=0)
    request_stats_max_iterations = _Field(int, minimum=0)
    batching_type = _Field(BatchingType)
    max_batch_size = _Field(int, optional=True, minimum=1)
    max_num_tokens = _Field(int, optional=True, minimum=1)
    max_queue_size = _Field(int, optional=True)
    parallel_config = _Field(ParallelConfig, optional=True)
    recv_poll_period_ms = _Field(int)
    max_seq_idle_microseconds = _Field(int)
    gather_generation_logits = _Field(bool)
    guided_decoding_config = _Field(GuidedDecodingConfig, optional=True)

    def __init__(
        self,
        max_beam_width=1,
        scheduler_config=None,
        kv_cache_config=None,
        enable_chunked_context=False,
        normalize_log_probs=True,
        iter_stats_max_iterations=1000,
        request_stats_max_iterations=0,
        batching_type=BatchingType.INFLIGHT,
        max_batch_size=None,
        max_num_tokens=None,
        parallel_config=None,
        max_queue_size=None,
        recv_poll_period_ms=0,
        max_seq_idle_microseconds=180_000_000,
        gather_generation_logits=False,
        guided_decoding_config=None,
    ):
        scheduler_config = SchedulerConfig() if scheduler_config is None else scheduler_config
        kv_cache_config = KvCacheConfig() if kv_cache_config is None else kv_cache_config
        _Field.init(self, **{k: v for k, v in locals().items() if k != "self"})


# -- requests ---------------------------------------------------------------------------------------------------
_SAMPLING_FIELDS = {
    "top_k": int, "top_p": float, "top_p_min": float, "top_p_reset_ids": int, "top_p_decay": float, "seed": int,
    "temperature": float, "min_tokens": int, "beam_search_diversity_rate": float, "length_penalty": float,
    "early_stopping": int, "beam_width_array": list, "repetition_penalty": float, "presence_penalty": float,
    "frequency_penalty": float, "no_repeat_ngram_size": int, "num_return_sequences": int, "min_p": float,
}


class SamplingConfig:
    __slots__ = ("_beam_width", *(f"_{name}" for name in _SAMPLING_FIELDS))
    beam_width = _Field(int, minimum=1)
    top_k = _Field(int, optional=True, minimum=0)
    top_p = _Field(float, optional=True, minimum=0.0, maximum=1.0)
    top_p_min = _Field(float, optional=True)
    top_p_reset_ids = _Field(int, optional=True)
    top_p_decay = _Field(float, optional=True)
    seed = _Field(int, optional=True, minimum=0)
    temperature = _Field(float, optional=True, minimum=0.0)
    min_tokens = _Field(int, optional=True, minimum=0)
    beam_search_diversity_rate = _Field(float, optional=True)
    length_penalty = _Field(float, optional=True)
    early_stopping = _Field(int, optional=True)
    beam_width_array = _Field(list, optional=True)
    repetition_penalty = _Field(float, optional=True)
    presence_penalty = _Field(float, optional=True)
    frequency_penalty = _Field(float, optional=True)
    no_repeat_ngram_size = _Field(int, optional=True)
    num_return_sequences = _Field(int, optional=True, minimum=1)
    min_p = _Field(float, optional=True)

    def __init__(
        self,
        beam_width=1,
        *,
        top_k=None,
        top_p=None,
        top_p_min=None,
        top_p_reset_ids=None,
        top_p_decay=None,
        seed=None,
        temperature=None,
        min_tokens=None,
        beam_search_diversity_rate=None,
        length_penalty=None,
        early_stopping=None,
        beam_width_array=None,
        repetition_penalty=None,
        presence_penalty=None,
        frequency_penalty=None,
        no_repeat_ngram_size=None,
        num_return_sequences=None,
        min_p=None,
    ):
        _Field.init(self, **{k: v for k, v in locals().items() if k != "self"})


class OutputConfig:
    __slots__ = (
        "_additional_model_outputs",
        "_exclude_input_from_output",
        "_return_context_logits",
        "_return_encoder_output",
        "_return_generation_logits",
        "_return_log_probs",
        "_return_perf_metrics",
    )
    return_log_probs = _Field(bool)
    return_context_logits = _Field(bool)
    return_generation_logits = _Field(bool)
    exclude_input_from_output = _Field(bool)
    return_encoder_output = _Field(bool)
    return_perf_metrics = _Field(bool)
    additional_model_outputs = _Field(list, optional=True)

    def __init__(
        self,
        return_log_probs=None,
        return_context_logits=None,
        return_generation_logits=None,
        exclude_input_from_output=None,
        return_encoder_output=None,
        return_perf_metrics=None,
        additional_model_outputs=None,
    ):
        flags = {k: False if v is None else v for k, v in locals().items() if k not in ("self", "additional_model_outputs")}
        _Field.init(self, additional_model_outputs=additional_model_outputs, **flags)


class GuidedDecodingParams:
    """One request's guide: its type and text (none for GuideType.JSON, any JSON)."""

    class GuideType(enum.Enum):
        JSON = 0
        JSON_SCHEMA = 1
        REGEX = 2
        EBNF_GRAMMAR = 3
        STRUCTURAL_TAG = 4

    __slots__ = ("_guide", "_guide_type")
    guide_type = _Field(GuideType, readonly=True)
    guide = _Field(str, optional=True, readonly=True)

    def __init__(self, guide_type, guide=None):
        _Field.init(self, guide_type=guide_type, guide=guide)


class KvCacheTransferMode(enum.Enum):
    DRAM = 0


class KvCacheRetentionConfig:
    """Retention priorities (0 to 100, 35 by default) for token ranges of a request's KV blocks. The constructor
    checks the ranges as the real one does (std::invalid_argument, a ValueError in Python): sorted by start, only
    the last may be open (token_end None), starts not negative, every range non-empty, no two overlapping.
    The double keeps the config on the request and schedules as if it were not there."""

    class TokenRangeRetentionConfig:
        __slots__ = ("_duration_ms", "_priority", "_token_end", "_token_start")
        token_start = _Field(int)
        token_end = _Field(int, optional=True)
        priority = _Field(int)
        duration_ms = _Field(timedelta, optional=True)

        def __init__(self, token_start, token_end, priority, duration_ms=None):
            _Field.init(self, token_start=token_start, token_end=token_end, priority=priority,
                        duration_ms=duration_ms)
            if not 0 <= priority <= 100:
                raise RuntimeError("Invalid priority value. Must be between 0 and 100")

    __slots__ = ("_decode_duration_ms", "_decode_retention_priority", "_directory", "_token_range_retention_configs",
                 "_transfer_mode")
    token_range_retention_configs = _Field(list, readonly=True, items=TokenRangeRetentionConfig)
    decode_retention_priority = _Field(int, readonly=True)
    decode_duration_ms = _Field(timedelta, optional=True, readonly=True)
    transfer_mode = _Field(KvCacheTransferMode, readonly=True)
    directory = _Field(str, optional=True, readonly=True)

    def __init__(self, token_range_retention_configs, decode_retention_priority=35, decode_duration_ms=None,
                 transfer_mode=KvCacheTransferMode.DRAM, directory=None):
        _Field.init(self, token_range_retention_configs=sorted(token_range_retention_configs,
                                                               key=lambda r: r.token_start),
                    decode_retention_priority=decode_retention_priority, decode_duration_ms=decode_duration_ms,
                    transfer_mode=transfer_mode, directory=directory)
        ranges = self._token_range_retention_configs
        for index, entry in enumerate(ranges):
            last = index == len(ranges) - 1
            if entry.token_end is None and not last:
                raise ValueError("Invalid use of end indicator.")
            if entry.token_start < 0:
                raise ValueError("Token indices must be non-negative.")
            if entry.token_end is not None and entry.token_start >= entry.token_end:
                raise ValueError("Range must have a positive, non-zero length.")
            if not last and entry.token_end > ranges[index + 1].token_start:
                raise ValueError("Token ranges must be non-overlapping.")


class Request:
    """There is no `priority` property (the reference says so): the engine keeps it privately."""

    __slots__ = ("_bad_words", "_cache_salt_id", "_client_id", "_embedding_bias", "_end_id", "_guided_decoding_params",
                 "_input_token_ids", "_kv_cache_retention_config", "_max_tokens",
                 "_num_return_sequences", "_output_config", "_pad_id", "_priority_value",
                 "_return_all_generated_tokens", "_sampling_config", "_stop_words", "_streaming")
    input_token_ids = _Field(list, readonly=True, items=int)
    max_tokens = _Field(int, readonly=True)
    streaming = _Field(bool)
    sampling_config = _Field(SamplingConfig)
    output_config = _Field(OutputConfig)
    end_id = _Field(int, optional=True)
    pad_id = _Field(int, optional=True)
    bad_words = _Field(list, optional=True, items=list)
    stop_words = _Field(list, optional=True, items=list)
    embedding_bias = _Field(object, optional=True)  # a tensor over the vocabulary (torch, float32)
    guided_decoding_params = _Field(GuidedDecodingParams, optional=True)
    kv_cache_retention_config = _Field(KvCacheRetentionConfig, optional=True)
    client_id = _Field(int, optional=True)
    return_all_generated_tokens = _Field(bool)
    cache_salt_id = _Field(int, optional=True)  # CacheSaltIDType, a uint64: blocks are reused only within equal salts

    def __init__(
        self,
        input_token_ids,
        max_tokens,
        *,
        streaming=False,
        sampling_config=None,
        output_config=None,
        end_id=None,
        pad_id=None,
        bad_words=None,
        stop_words=None,
        embedding_bias=None,
        guided_decoding_params=None,
        kv_cache_retention_config=None,
        client_id=None,
        return_all_generated_tokens=False,
        priority=0.5,
        num_return_sequences=1,
        cache_salt_id=None,
    ):
        sampling_config = SamplingConfig() if sampling_config is None else sampling_config
        output_config = OutputConfig() if output_config is None else output_config
        self._priority_value = _check("priority", priority, float)
        self._num_return_sequences = _check("num_return_sequences", num_return_sequences, int)
        if cache_salt_id is not None and not (isinstance(cache_salt_id, int) and 0 <= cache_salt_id < 2**64):
            raise TypeError("incompatible function arguments: 'cache_salt_id' must be an unsigned 64-bit integer")
        for words in (bad_words or []) + (stop_words or []):
            _check("stop_words", words, list, items=int)
        if embedding_bias is not None and (getattr(embedding_bias, "dim", lambda: 0)() != 1
                                           or str(getattr(embedding_bias, "dtype", "")) != "torch.float32"):
            raise TypeError("incompatible function arguments: 'embedding_bias' must be a 1-D float32 tensor")
        _Field.init(self, **{k: v for k, v in locals().items()
                            if k not in ("self", "priority", "num_return_sequences", "words")})


# -- the executor -----------------------------------------------------------------------------------------------
class Executor:
    """Constructor (A) only: Executor(model_path, model_type, executor_config), model_path an engine folder."""

    def __init__(self, model_path, model_type, executor_config):
        if not isinstance(model_path, str | PathLike):
            raise TypeError(f"model_path must be str or PathLike, got {type(model_path).__name__}")
        _check("model_type", model_type, ModelType)
        _check("executor_config", executor_config, ExecutorConfig)
        if model_type is not ModelType.DECODER_ONLY:
            raise RuntimeError("the test double runs decoder-only engines")
        self._engine = _engine.Engine(Path(model_path), executor_config, self._make_response, self._make_stats)

    def enqueue_request(self, request) -> int:
        _check("request", request, Request)
        return self._engine.enqueue([request])[0]

    def enqueue_requests(self, requests) -> list[int]:
        _check("requests", requests, list, items=Request)
        return self._engine.enqueue(requests)

    def await_responses(self, *args, **kwargs):
        chosen, values = _bind_overload(
            "await_responses", args, kwargs,
            [("timeout", timedelta, None)],
            [("id", int), ("timeout", timedelta, None)],
            [("ids", list), ("timeout", timedelta, None)],
        )
        timeout = values["timeout"]
        seconds = None if timeout is None else max(timeout.total_seconds(), 0.0)
        if chosen == 0:
            return self._engine.await_responses(None, seconds)
        if chosen == 1:
            return self._engine.await_responses([values["id"]], seconds)
        return [self._engine.await_responses([one], seconds) for one in values["ids"]]

    def get_num_responses_ready(self, id=None) -> int:
        return self._engine.num_responses_ready(_check("id", id, int, optional=True))

    def cancel_request(self, id) -> None:
        self._engine.cancel(_check("id", id, int))

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        return self._engine.drain_stats()

    def can_enqueue_requests(self) -> bool:
        return not self._engine.shutdown_called

    def shutdown(self) -> None:
        self._engine.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.shutdown()

    @staticmethod
    def _make_response(request_id: int, *, error: str | None = None, tokens=(), reason=None, final=False,
                       log_probs=None, decoding_iter=0, generation_logits=None, perf_metrics=None) -> Response:
        if error is not None:
            return Response(request_id, error)
        result = Result()
        result.is_final = result.is_sequence_final = final
        result.output_token_ids = [list(tokens)]
        result.finish_reasons = [FinishReason[reason] if reason else FinishReason.NOT_FINISHED]
        if log_probs is not None:
            result.log_probs = [list(log_probs)]
            result.cum_log_probs = [sum(log_probs)]
        result.decoding_iter = decoding_iter
        result.generation_logits = generation_logits
        result.request_perf_metrics = perf_metrics
        return Response(request_id, result)

    @staticmethod
    def _make_stats(values: dict, kv: dict, batching: dict) -> IterationStats:
        stats, kv_stats, ifb = IterationStats(), KvCacheStats(), InflightBatchingStats()
        for target, source in ((stats, values), (kv_stats, kv), (ifb, batching)):
            for name, value in source.items():
                setattr(target, name, value)
        stats.kv_cache_stats, stats.inflight_batching_stats = kv_stats, ifb
        return stats
