"""An EngineRequest as a TensorRT-LLM Request: sampling, end and stop tokens, priority, outputs, cache salt.

Choices: `n` arrives as n EngineRequests (one per choice, each with its own seed), so each is its own
executor request rather than one request with num_return_sequences: every choice has its own stream,
cancel and seed, and block reuse makes the shared prompt cheap. Stop strings are matched on text by the
worker for every backend; a stop string whose tokenisation is exact is also given to the engine as a
token-level stop word, so the engine ends the sequence in the step that produced it.
"""

from __future__ import annotations

import math
from types import ModuleType

from tokenizers import Tokenizer

from orchestrator.backends.options import SYSTEM_PROMPT_PRIORITY
from orchestrator.engine.manifest import EngineManifest
from orchestrator.engine.request import EngineRequest
from orchestrator.structured.guide import Guide

PRIORITY_SCALE = 8.0
# The TopK sampling layer's largest k: a larger one is clipped to it, with only a warning in the engine's log
# (reference §9). 0 means no top-k truncation.
MAX_ENGINE_TOP_K = 1024


def engine_top_k(top_k: int) -> int:
    """The engine's top_k for a request's. Up to 1024 it is sent as is. Above, the engine could only clip it to 1024,
    cutting tokens the request keeps, so it is sent as 0 (the whole vocabulary): exactly what a top_k of at least the
    vocabulary size means, and for 1025 up to the vocabulary size the nearest the engine can do without dropping a
    token the request keeps (the tokens ranked below it carry what little probability is left)."""
    return 0 if top_k > MAX_ENGINE_TOP_K else top_k


def cache_salt_id(salt: str) -> int | None:
    """The request's cache salt as 1.2's `cache_salt_id` (an unsigned 64-bit integer that every block key of the
    request carries: blocks are reused only between requests of equal salt ids); None for the anonymous salt "",
    whose blocks carry no salt, as before salts existed. The salt is a hex digest (api/cache_salt.py): its first
    64 bits are the id."""
    return int(salt[:16], 16) if salt else None


def engine_priority(priority: int) -> float:
    """TensorRT-LLM's priority (a float in [0, 1], default 0.5, higher first) for Inferno's integer one.

    0 maps to 0.5; the mapping is strictly increasing, so the engine keeps every order the scheduler
    gives: 1 -> 0.54, 8 -> 0.75, 100 -> 0.97, -8 -> 0.25. It never reaches 0 or 1.
    """
    return 0.5 + math.atan(priority / PRIORITY_SCALE) / math.pi


class StopWords:
    """Token sequences for stop strings whose tokenisation is exact.

    A stop string is exact when its tokens decode back to it on their own and after other text; then the
    engine seeing those tokens means the text contains the string. Others (a special token, a string a
    SentencePiece tokenizer would prefix with a space) are left to the worker's text matcher alone.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._context = tokenizer.encode("a", add_special_tokens=False).ids

    def exact(self, stop: str) -> list[int] | None:
        ids = self._tokenizer.encode(stop, add_special_tokens=False).ids
        if not ids or self._tokenizer.decode(ids) != stop:
            return None
        if self._tokenizer.decode(self._context + ids) != self._tokenizer.decode(self._context) + stop:
            return None
        return ids


class RequestBuilder:
    """EngineRequests as executor Requests.

    - ignore_eos is `end_id=-1` (no token matches it), as TensorRT-LLM's own LLM API does.
    - The model's other end tokens (Llama 3's <|eot_id|>) and the request's stop_token_ids are one-token stop
      words. The engine's min_tokens holds back only `end_id`, so when a request has min_tokens these are left
      out of the engine's stop words and the backend ends the request itself at the first of them after
      min_tokens (`end_tokens`).
    - logit_bias is the request's `embedding_bias`: a float32 tensor over the model's vocabulary added to the
      logits (the LLM API passes the same keyword), built only for requests that ask.
    - top_logprobs asks for generation logits (the executor gathers them where the model's settings say so).
    - top_k above 1024 is sent as 0, the whole vocabulary (`engine_top_k`).
    - Every request asks for perf metrics: a copy of a small struct per result, read for the cached prompt
      tokens (`usage.prompt_tokens_details.cached_tokens`).
    - With `retain_system_prompt` (the model's setting), a request's system prompt and tools (its
      `system_prefix_tokens`) go at SYSTEM_PROMPT_PRIORITY in a KvCacheRetentionConfig: their blocks are evicted
      (to the host tier, where there is one) after every block of default priority. The rest keeps the default.
    """

    def __init__(self, trtllm: ModuleType, manifest: EngineManifest, tokenizer: Tokenizer, vocab_size: int,
                 retain_system_prompt: bool = False):
        facts = manifest.tokenizer
        self._trtllm = trtllm
        self._end_id = facts.eos_token_ids[0]  # always given: the engine's behaviour without one is unspecified
        self._pad_id = facts.pad_token_id
        self._extra_eos = tuple(facts.eos_token_ids[1:])  # e.g. Llama 3's <|eot_id|>
        self._stop_words = StopWords(tokenizer)
        self._vocab_size = vocab_size
        self._retain_system_prompt = retain_system_prompt

    def end_tokens(self, request: EngineRequest) -> frozenset[int]:
        """Tokens besides end_id that end this request: the model's other end tokens unless ignored, and its
        stop tokens."""
        return frozenset(request.stop_token_ids) | (frozenset() if request.ignore_eos else frozenset(self._extra_eos))

    def build(self, request: EngineRequest):
        trtllm = self._trtllm
        output = trtllm.OutputConfig(
            exclude_input_from_output=True,
            return_log_probs=request.logprobs,
            return_generation_logits=request.top_logprobs > 0,
            return_perf_metrics=True,  # every result then says how many prompt blocks came from the prefix cache
        )
        return trtllm.Request(
            list(request.prompt_ids),
            request.max_new_tokens,  # new tokens, not counting the prompt
            streaming=True,  # every response carries only the tokens new since the last one
            sampling_config=self._sampling(request),
            output_config=output,
            end_id=-1 if request.ignore_eos else self._end_id,
            pad_id=self._pad_id,
            stop_words=self._stops(request) or None,
            embedding_bias=self._embedding_bias(request.sampling.logit_bias),
            guided_decoding_params=self._guided(request.guide),
            priority=engine_priority(request.priority),
            kv_cache_retention_config=self._retention(request),
            cache_salt_id=cache_salt_id(request.cache_salt),
        )

    def _retention(self, request: EngineRequest):
        """The system prompt's token range at high priority (None: every block at the engine's default). A range
        gives its priority to every block it touches, so the block holding both the prefix's last tokens and the
        first user message's is kept too: at most one block more than asked."""
        if not (self._retain_system_prompt and request.system_prefix_tokens):
            return None
        config = self._trtllm.KvCacheRetentionConfig
        kept = config.TokenRangeRetentionConfig(0, request.system_prefix_tokens, SYSTEM_PROMPT_PRIORITY)
        return config([kept])

    def _stops(self, request: EngineRequest) -> list[list[int]]:
        if request.min_tokens:  # the backend ends the request at these, once min_tokens are out
            return []
        words = [ids for ids in map(self._stop_words.exact, request.stop) if ids is not None]
        return [[token] for token in sorted(self.end_tokens(request))] + words

    def _embedding_bias(self, logit_bias: tuple[tuple[int, float], ...]):
        if not logit_bias:
            return None
        import torch  # TensorRT-LLM depends on it; only requests with logit_bias need it here

        bias = torch.zeros(self._vocab_size, dtype=torch.float32)
        for token, value in logit_bias:
            bias[token] = value
        return bias

    def _guided(self, guide: Guide | None):
        """GuidedDecodingParams for a guide. A structural tag goes as the EBNF grammar it stands for: every 1.2
        revision read compiles EBNF_GRAMMAR, not every one STRUCTURAL_TAG (the checker compiled both forms)."""
        if guide is None:
            return None
        params = self._trtllm.GuidedDecodingParams
        guide_type, text = guide.trtllm_guide()
        if guide_type == "STRUCTURAL_TAG":
            from orchestrator.structured.grammar.lowering import (
                structural_tag_as_ebnf,  # xgrammar: TensorRT-LLM has it
            )

            guide_type, text = "EBNF_GRAMMAR", structural_tag_as_ebnf(text)
        return params(params.GuideType[guide_type], text)

    def _sampling(self, request: EngineRequest):
        sampling = request.sampling
        extras = {}
        if sampling.presence_penalty:
            extras["presence_penalty"] = sampling.presence_penalty
        if sampling.frequency_penalty:
            extras["frequency_penalty"] = sampling.frequency_penalty
        if sampling.repetition_penalty != 1.0:
            extras["repetition_penalty"] = sampling.repetition_penalty
        if request.min_tokens:
            extras["min_tokens"] = request.min_tokens
        if sampling.greedy:
            return self._trtllm.SamplingConfig(top_k=1, **extras)
        if sampling.min_p:
            extras["min_p"] = sampling.min_p
        return self._trtllm.SamplingConfig(
            temperature=sampling.temperature,
            top_k=engine_top_k(sampling.top_k),  # 0 is the whole vocabulary, as for the engine
            top_p=sampling.top_p,  # always given: the engine's default (0) with top_k 0 would be greedy
            seed=sampling.seed,
            **extras,
        )
