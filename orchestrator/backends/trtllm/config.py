"""The Executor's configuration, from the engine's manifest and the server's settings.

ExecutorConfig stores a misspelled attribute silently (the class accepts dynamic attributes), so every
setting goes through a constructor keyword, where a wrong name raises TypeError at once; and only names
listed in TensorRT-LLM 1.2's bindings are used (tests/trtllm/test_conformance.py holds us to that).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from orchestrator.backends.options import TrtllmOptions
from orchestrator.backends.protocol import BackendSettings
from orchestrator.backends.trtllm.runtime import Runtime
from orchestrator.errors import BackendUnavailable, ModelUnavailable
from orchestrator.structured.vocabulary import load_vocabulary

# The KV cache is sized by the byte budget the server assigns. The fraction is set explicitly, never left to
# TensorRT-LLM's implicit 0.9: it is only a safety cap on what is free after the engine loads.
FREE_MEMORY_CAP = 0.9
# Iteration stats kept between two reads (each /metrics scrape drains them); enough for the newest busy step.
ITER_STATS_KEPT = 64
# One permit of the scheduler may carry up to this many choices (n), each its own executor request.
# The scheduler bounds admissions, so the executor's own queue limit only guards against a runaway caller.
REQUESTS_PER_PERMIT = 16


def kv_cache_tokens(settings: BackendSettings) -> int:
    """KvCacheConfig.max_tokens for the assigned byte budget, rounded down to whole blocks. On the TensorRT
    engine path the cache is sized by max_tokens and the free-memory fraction only (max_gpu_total_bytes is
    read by the PyTorch backend alone, reference §8), so the byte budget is expressed in tokens."""
    kv = settings.manifest.kv_cache
    block_bytes = kv.bytes_per_token * kv.tokens_per_block
    blocks = settings.kv_cache_bytes // block_bytes
    if blocks < 1:
        raise ModelUnavailable(
            f"a KV cache budget of {settings.kv_cache_bytes} bytes holds no block of this engine "
            f"({block_bytes} bytes for {kv.tokens_per_block} tokens); raise worker.kv_cache_bytes"
        )
    return blocks * kv.tokens_per_block


def engine_vocab_size(engine_dir: Path) -> int:
    """The model's vocabulary size, from the engine's config.json (what embedding_bias must cover)."""
    try:
        return int(json.loads((engine_dir / "config.json").read_text())["pretrained_config"]["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelUnavailable(f"{engine_dir / 'config.json'} does not say the model's vocab_size: {exc}") from exc


def build_executor_config(trtllm: ModuleType, settings: BackendSettings, runtime: Runtime, guided: bool = True):
    """ExecutorConfig for in-flight batching over a paged KV cache with prefix reuse and chunked prefill; with
    `guided`, structured outputs too (a load whose guided decoder cannot be built is retried without)."""
    limits = settings.manifest.limits
    options: TrtllmOptions = settings.options
    kv_cache = trtllm.KvCacheConfig(
        enable_block_reuse=True,
        max_tokens=kv_cache_tokens(settings),  # the budget, the same on every GPU; it binds before the cap
        free_gpu_memory_fraction=FREE_MEMORY_CAP,
        # The host KV tier: reusable blocks evicted from the GPU go to this much pinned host RAM instead of being
        # dropped, and come back (onboard_blocks, on by default) when a prompt reuses them. None: no tier. The
        # memory ledger holds these bytes of host RAM for the model while it is loaded.
        host_cache_size=options.prompt_cache_bytes or None,
    )
    return trtllm.ExecutorConfig(
        max_beam_width=1,
        scheduler_config=trtllm.SchedulerConfig(capacity_scheduler_policy=_capacity_policy(trtllm, settings)),
        kv_cache_config=kv_cache,
        enable_chunked_context=True,  # the Python binding's default is off (C++'s is on)
        iter_stats_max_iterations=ITER_STATS_KEPT,
        max_batch_size=limits.max_batch_size,
        max_num_tokens=limits.max_num_tokens,
        max_queue_size=limits.max_batch_size * REQUESTS_PER_PERMIT,
        parallel_config=_parallel_config(trtllm, settings, runtime),
        # The model's own log probabilities, as OpenAI's: the binding's default (True) gives them relative to the
        # top-k set, so 0.0 for every greedy token (reference §9). NVIDIA's LLM API passes False too.
        normalize_log_probs=False,
        # For top_logprobs: a runtime setting in 1.2, no build flag needed (reference §9); each request asking
        # for logits then holds a pinned host buffer of max_new_tokens x vocab_padded logits.
        gather_generation_logits=options.generation_logits,
        guided_decoding_config=guided_decoding_config(trtllm, settings) if guided else None,
    )


def guided_decoding_config(trtllm: ModuleType, settings: BackendSettings):
    """Structured outputs on the engine: xgrammar (the only backend the TensorRT engine runtime accepts) over
    the model's vocabulary, as the grammar checker compiled every guide before admission (reference §8)."""
    vocabulary = load_vocabulary(settings.engine_dir, stop_token_ids=settings.manifest.tokenizer.eos_token_ids)
    return trtllm.GuidedDecodingConfig(trtllm.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR,
                                       encoded_vocab=list(vocabulary.encoded),
                                       tokenizer_str=vocabulary.tokenizer_json,
                                       stop_token_ids=list(vocabulary.stop_token_ids))


def _capacity_policy(trtllm: ModuleType, settings: BackendSettings):
    """The policy the backend's options name (TrtllmOptions has checked it is one of these)."""
    options: TrtllmOptions = settings.options
    policies = {
        "guaranteed_no_evict": trtllm.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
        "max_utilization": trtllm.CapacitySchedulerPolicy.MAX_UTILIZATION,  # may pause and resume requests
    }
    return policies[options.capacity_policy]


def _parallel_config(trtllm: ModuleType, settings: BackendSettings, runtime: Runtime):
    """Orchestrator mode for multi-GPU engines: this process spawns one executorWorker per rank and stays
    the single owner of the engine (requests, responses, stats, shutdown). None for one GPU."""
    if settings.manifest.parallel.world_size == 1:
        return None
    worker = runtime.worker_executable
    if not worker.is_file():
        raise BackendUnavailable(
            f"a {settings.manifest.parallel.world_size}-GPU engine needs TensorRT-LLM's executorWorker, "
            f"which is missing at {worker}; reinstall TensorRT-LLM {runtime.version}"
        )
    return trtllm.ParallelConfig(
        communication_mode=trtllm.CommunicationMode.ORCHESTRATOR,
        orchestrator_config=trtllm.OrchestratorConfig(is_orchestrator=True, worker_executable_path=str(worker)),
    )
