"""Responses and stats of the test double of TensorRT-LLM 1.2's executor bindings (re-exported by
`tensorrt_llm.bindings.executor`, whose docstring says what the double promises)."""

from __future__ import annotations

import json
from datetime import timedelta

from tensorrt_llm.bindings._types import bind_overload as _bind_overload


# -- responses --------------------------------------------------------------------------------------------------
class Result:
    __slots__ = ("additional_outputs", "avg_decoded_tokens_per_iter", "context_logits", "context_phase_params",
                 "cum_log_probs", "decoding_iter", "encoder_output", "finish_reasons", "generation_logits", "is_final",
                 "is_sequence_final", "log_probs", "output_token_ids", "request_perf_metrics", "sequence_index",
                 "spec_dec_fast_logits_info")

    def __init__(self):
        self.is_final = False
        self.is_sequence_final = False
        self.output_token_ids: list[list[int]] = []
        self.finish_reasons: list = []  # FinishReason per beam
        self.cum_log_probs: list[float] | None = None
        self.log_probs: list[list[float]] | None = None
        self.context_logits = None
        self.generation_logits = None
        self.encoder_output = None
        self.sequence_index = 0
        self.decoding_iter = 0
        self.avg_decoded_tokens_per_iter = 1.0
        self.context_phase_params = None
        self.request_perf_metrics: RequestPerfMetrics | None = None  # only when asked for
        self.additional_outputs: list = []
        self.spec_dec_fast_logits_info = None


class TimingMetrics:
    """When a request arrived, was first scheduled, and got its first and last token (steady-clock times, as
    durations since the clock's epoch), and its KV cache transfer's (disaggregated serving only: zero here)."""

    __slots__ = ("arrival_time", "first_scheduled_time", "first_token_time", "kv_cache_size",
                 "kv_cache_transfer_end", "kv_cache_transfer_start", "last_token_time")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0 if name == "kv_cache_size" else timedelta(0))


class KvCacheMetrics:
    """A request's context blocks: allocated, newly allocated, reused from the prefix cache, missed."""

    __slots__ = ("kv_cache_hit_rate", "num_missed_blocks", "num_new_allocated_blocks", "num_reused_blocks",
                 "num_total_allocated_blocks")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0.0 if name == "kv_cache_hit_rate" else 0)


class SpeculativeDecodingMetrics:
    __slots__ = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")

    def __init__(self):
        self.acceptance_rate = 0.0
        self.total_accepted_draft_tokens = 0
        self.total_draft_tokens = 0


class RequestPerfMetrics:
    """What a result carries when its request asked for OutputConfig(return_perf_metrics=True)."""

    __slots__ = ("first_iter", "iter", "kv_cache_metrics", "last_iter", "speculative_decoding", "timing_metrics")

    def __init__(self):
        self.timing_metrics = TimingMetrics()
        self.kv_cache_metrics = KvCacheMetrics()
        self.speculative_decoding = SpeculativeDecodingMetrics()
        self.first_iter: int | None = None
        self.last_iter: int | None = None
        self.iter: int | None = None


class Response:
    """Either a result or an error message for one request. `has_error()` is a method; `error_msg` raises
    when there is no error and `result` when there is one."""

    __slots__ = ("_client_id", "_error_msg", "_request_id", "_result")

    def __init__(self, *args, **kwargs):
        chosen, values = _bind_overload(
            "Response", args, kwargs,
            [("request_id", int), ("error_msg", str), ("client_id", int, None)],
            [("request_id", int), ("result", Result), ("client_id", int, None)],
        )
        self._request_id = values["request_id"]
        self._client_id = values["client_id"]
        self._error_msg = values["error_msg"] if chosen == 0 else None
        self._result = values["result"] if chosen == 1 else None

    @property
    def request_id(self) -> int:
        return self._request_id

    @property
    def client_id(self) -> int | None:
        return self._client_id

    def has_error(self) -> bool:
        return self._error_msg is not None

    @property
    def error_msg(self) -> str:
        if self._error_msg is None:
            raise RuntimeError("Cannot get the error message of a response without an error")
        return self._error_msg

    @property
    def result(self) -> Result:
        if self._error_msg is not None:
            raise RuntimeError(f"Cannot get the result of a response with an error: {self._error_msg}")
        return self._result


# -- stats ------------------------------------------------------------------------------------------------------
class KvCacheStats:
    __slots__ = ("alloc_new_blocks", "alloc_total_blocks", "cache_hit_rate", "free_num_blocks", "max_num_blocks",
                 "missed_blocks", "reused_blocks", "tokens_per_block", "used_num_blocks")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0.0 if name == "cache_hit_rate" else 0)


class InflightBatchingStats:
    __slots__ = ("avg_num_decoded_tokens_per_iter", "micro_batch_id", "num_context_requests", "num_ctx_tokens",
                 "num_gen_requests", "num_paused_requests", "num_scheduled_requests")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0.0 if name == "avg_num_decoded_tokens_per_iter" else 0)


class IterationStats:
    __slots__ = ("cpu_mem_usage", "cross_kv_cache_stats", "gpu_mem_usage", "inflight_batching_stats", "iter",
                 "iter_latency_ms", "kv_cache_stats", "max_num_active_requests", "new_active_requests_queue_latency_ms",
                 "num_active_requests", "num_completed_requests", "num_new_active_requests", "num_queued_requests",
                 "pinned_mem_usage", "specdec_stats", "static_batching_stats", "timestamp")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)
        self.timestamp = ""
        self.iter_latency_ms = 0.0
        self.new_active_requests_queue_latency_ms = 0.0
        for name in ("kv_cache_stats", "cross_kv_cache_stats", "static_batching_stats", "inflight_batching_stats",
                     "specdec_stats"):
            setattr(self, name, None)

    def to_json_str(self) -> str:
        def plain(value):
            if hasattr(value, "__slots__"):
                return {name: plain(getattr(value, name)) for name in value.__slots__}
            return value

        return json.dumps(plain(self))
