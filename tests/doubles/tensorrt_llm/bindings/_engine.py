"""The engine inside the test double of TensorRT-LLM's Executor: a loop thread, a queue, a batch, and a
"model" that repeats the prompt (see executor.py's docstring for what it promises).

It reads what a real engine folder holds: config.json (build_config limits, tokens_per_block, the model's
shape for the KV cache's bytes per token, the mapping's world size) and rank<N>.engine files.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tensorrt_llm.bindings._guided import GuidedVocabulary
from tensorrt_llm.bindings._perf import PerfRecord, now
from tensorrt_llm.bindings._prefix import PrefixCache

STEP_S = 0.005  # what one engine step (one token for every running request) takes
MAX_TOP_K = 1024  # the TopK sampling layer's largest k: a larger one is clipped to it, with a warning (reference §9)
FREE_BYTES_AFTER_LOAD = 80 * 2**30  # the GPU memory the double pretends is free once the engine is loaded
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}


class GrammarFailure(Exception):
    """A request's grammar failed to compile inside the engine loop."""


@dataclass(frozen=True)
class EngineFacts:
    max_input_len: int
    max_seq_len: int
    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int
    world_size: int
    kv_bytes_per_token: int  # K and V, all layers, all ranks
    vocab_size: int
    fail_after_tokens: int | None
    load_s: float  # how long the constructor holds the GIL, as a real engine load does
    guided_setup_error: str | None  # the guided decoder cannot be built over this engine's vocabulary

    @classmethod
    def read(cls, folder: Path) -> EngineFacts:
        path = folder / "config.json"
        if not path.is_file():
            raise RuntimeError(f"[TensorRT-LLM][ERROR] cannot open {path}: no engine config")
        config = json.loads(path.read_text())
        pretrained, build = config["pretrained_config"], config["build_config"]
        mapping = pretrained.get("mapping", {})
        world_size = mapping.get("world_size", 1)
        for rank in range(world_size):
            if not (folder / f"rank{rank}.engine").is_file():
                raise RuntimeError(f"[TensorRT-LLM][ERROR] engine file {folder / f'rank{rank}.engine'} not found")
        head_dim = pretrained.get("head_size") or pretrained["hidden_size"] // pretrained["num_attention_heads"]
        kv_heads = pretrained.get("num_key_value_heads") or pretrained["num_attention_heads"]
        per_token = 2 * pretrained["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[pretrained["dtype"]]
        plan = _fault_plan(folder / "rank0.engine")
        return cls(
            max_input_len=build["max_input_len"],
            max_seq_len=build["max_seq_len"],
            max_batch_size=build["max_batch_size"],
            max_num_tokens=build["max_num_tokens"],
            tokens_per_block=build["plugin_config"]["tokens_per_block"],
            world_size=world_size,
            kv_bytes_per_token=per_token,
            vocab_size=pretrained["vocab_size"],
            fail_after_tokens=plan.get("fail_after_tokens"),
            load_s=float(plan.get("load_s", 0)),
            guided_setup_error=plan.get("guided_setup_error"),
        )


def _fault_plan(path: Path) -> dict:
    try:
        plan = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError):
        return {}
    return plan if isinstance(plan, dict) else {}


@dataclass
class Sequence:
    id: int
    prompt: list[int]
    max_new: int
    end_id: int | None
    stop_words: list[list[int]]
    streaming: bool
    exclude_input: bool
    log_probs: bool
    min_tokens: int
    priority: float
    position: int
    bias: dict[int, float] = field(default_factory=dict)  # the embedding_bias's non-zero entries
    logits_vocab: int = 0  # the vocabulary size when generation logits are returned, else 0
    guided: object = None  # _guided.GuidedChoice: the request's grammar, when it has one
    vocab_size: int = 0  # the model's vocabulary: every token the "model" gives no score has logit 0
    top_k: int = 0  # the sampling layer's k after its clamp; 0 is the whole vocabulary
    normalize_log_probs: bool = True  # ExecutorConfig.normalize_log_probs
    generated: list[int] = field(default_factory=list)
    logits: list = field(default_factory=list)  # per generated token not yet streamed: its logits row
    probs: list[float] = field(default_factory=list)
    sent: int = 0  # generated tokens already streamed
    perf: PerfRecord | None = None  # when the request asked for perf metrics
    context_done: bool = False  # its first step (the context phase) has run
    cache_salt: int | None = None  # the request's cache_salt_id: its blocks are reused only by the same salt

    def step(self) -> str | None:
        """Generate one token; the finish reason's name if that ended the sequence."""
        token = self.prompt[self.position % len(self.prompt)]
        self.position += 1
        if token == self.end_id and len(self.generated) < self.min_tokens:  # min_tokens: end_id is banned
            for _ in range(len(self.prompt)):
                token = self.prompt[self.position % len(self.prompt)]
                self.position += 1
                if token != self.end_id:
                    break
        scores = self._scores(token)
        if self.guided is not None:
            end = self.end_id if len(self.generated) >= self.min_tokens else None
            token = self.guided.choose(scores, end)
            self.guided.accept(token)
        elif self.bias or self.logits_vocab:
            banned = self.end_id if len(self.generated) < self.min_tokens else None
            token = max((t for t in scores if t != banned), key=lambda t: scores[t])  # first of equals: the prompt's
        if self.logits_vocab:
            self.logits.append(scores)
        if token == self.end_id:
            return "END_ID"  # the end token is not part of the output
        self.generated.append(token)
        self.probs.append(self._log_prob(scores, token))
        if any(word and self.generated[-len(word):] == word for word in self.stop_words):
            return "STOP_WORDS"  # the stop word's tokens are part of the output
        if len(self.generated) >= self.max_new:
            return "LENGTH"
        return None

    def _log_prob(self, scores: dict[int, float], token: int) -> float:
        """The chosen token's log probability as the sampling kernels give it (reference §9): the model's own,
        log softmax over the whole vocabulary, or with normalize_log_probs that minus log of the top-k set's
        probability (so 0.0 for every greedy token)."""
        others = max(self.vocab_size - len(scores), 0)  # tokens with logit 0
        chosen = scores.get(token, 0.0)
        if self.normalize_log_probs and self.top_k:
            top = (sorted(scores.values(), reverse=True) + [0.0] * self.top_k)[: self.top_k]
            return chosen - math.log(sum(math.exp(value) for value in top))
        return chosen - math.log(sum(math.exp(value) for value in scores.values()) + others)

    def _scores(self, token: int) -> dict[int, float]:
        """The "model's" logits where they are not 0: 10 for the prompt's next token, 9 and 8 for the two after
        it, plus the request's bias."""
        n = len(self.prompt)
        scores: dict[int, float] = {}
        for offset, score in ((0, 10.0), (0, 9.0), (1, 8.0)):
            candidate = token if score == 10.0 else self.prompt[(self.position + offset) % n]
            scores.setdefault(candidate, score)
        for biased, value in self.bias.items():
            scores[biased] = scores.get(biased, 0.0) + value
        return scores

    def logits_tensor(self, count: int):
        """The streamed tokens' logits as [tokens, beam, vocab], from the last `count` steps."""
        import torch

        rows, self.logits = self.logits[-count:], []
        tensor = torch.zeros(len(rows), 1, self.logits_vocab, dtype=torch.float32)
        for i, scores in enumerate(rows):
            for token, value in scores.items():
                tensor[i, 0, token] = value
        return tensor


def hold_the_gil(seconds: float) -> None:
    """Keep the GIL for `seconds`, as the real constructor does while it loads an engine: no other thread of
    this process runs meanwhile (the switch interval is the longest a thread keeps the GIL when another waits)."""
    if seconds <= 0:
        return
    interval = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 1)
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
    finally:
        sys.setswitchinterval(interval)


class Engine:
    def __init__(self, folder: Path, config, make_response: Callable, make_stats: Callable):
        self.facts = EngineFacts.read(folder)
        hold_the_gil(self.facts.load_s)
        self._orchestrator = self._check_parallel(config)
        self._make_response, self._make_stats = make_response, make_stats
        self._max_batch = min(config.max_batch_size or self.facts.max_batch_size, self.facts.max_batch_size)
        self._max_queue = config.max_queue_size
        self._stats_kept = config.iter_stats_max_iterations
        self._gather_logits = config.gather_generation_logits
        self._normalize_log_probs = config.normalize_log_probs
        self._guided = self._guided_vocabulary(config.guided_decoding_config)
        self.top_k_clipped: list[int] = []  # every top_k the sampling layer clipped to MAX_TOP_K (its warnings)
        self.max_blocks = self._size_kv_cache(config.kv_cache_config)
        self._prefix = self._prefix_cache(config.kv_cache_config)
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._queue: list[tuple[int, object]] = []
        self._active: list[Sequence] = []
        self._responses: list = []
        self._stats: list = []
        self._cancelled: set[int] = set()
        self._terminated: set[int] = set()
        self.finish_reasons: dict[int, str] = {}  # how each request ended (for tests of draining)
        self._arrivals: dict[int, object] = {}  # queued request id -> when it arrived (steady clock)
        self._counters = {"reused_blocks": 0, "missed_blocks": 0, "alloc_total_blocks": 0, "alloc_new_blocks": 0}
        self._next_id = 1
        self._iter = 0
        self.shutdown_called = False
        self._thread = threading.Thread(target=self._loop, name="executionLoop", daemon=True)
        self._thread.start()

    def _guided_vocabulary(self, config) -> GuidedVocabulary | None:
        """The guided decoder, built once per executor: a vocabulary it cannot read fails the whole load."""
        if config is None:
            return None
        if self.facts.guided_setup_error is not None:
            raise RuntimeError(f"[TensorRT-LLM][ERROR] failed to build the guided decoder: {self.facts.guided_setup_error}")
        return GuidedVocabulary(config)

    def _check_parallel(self, config) -> bool:
        """True in orchestrator mode (this process drives executorWorker ranks), False in leader mode."""
        parallel = config.parallel_config
        if parallel is not None and parallel.communication_mode.name == "ORCHESTRATOR":
            orchestrator = parallel.orchestrator_config
            if orchestrator is None or not orchestrator.is_orchestrator:
                raise RuntimeError("ORCHESTRATOR mode needs an OrchestratorConfig with is_orchestrator=True")
            if not Path(orchestrator.worker_executable_path).is_file():
                raise RuntimeError(f"executorWorker not found at '{orchestrator.worker_executable_path}'")
            return True
        if self.facts.world_size > 1:  # LEADER: every rank runs this program under MPI; here there is one
            raise RuntimeError("With communicationMode kLEADER, MPI worldSize is expected to be equal to tp*pp*cp "
                               f"({self.facts.world_size}) when participantIds are not specified")
        return False

    def _prefix_cache(self, kv) -> PrefixCache:
        if kv.enable_block_reuse and kv.enable_partial_reuse and not kv.copy_on_partial_reuse:
            raise RuntimeError("the test double does not model copy_on_partial_reuse=False (reference counts)")
        return PrefixCache(self.facts.tokens_per_block, self.max_blocks, reuse=kv.enable_block_reuse,
                           partial=kv.enable_partial_reuse)

    def _size_kv_cache(self, kv) -> int:
        """The smaller of max_tokens and the free-memory fraction (0.9 when None). max_gpu_total_bytes is not read
        on the TensorRT engine path (reference §8: the PyTorch backend reads it)."""
        block_bytes = self.facts.tokens_per_block * self.facts.kv_bytes_per_token // self.facts.world_size
        fraction = 0.9 if kv.free_gpu_memory_fraction is None else kv.free_gpu_memory_fraction
        limits = [int(fraction * FREE_BYTES_AFTER_LOAD) // block_bytes]
        if kv.max_tokens is not None:
            limits.append(kv.max_tokens // self.facts.tokens_per_block)
        return min(limits)

    # -- the API side (any thread) -------------------------------------------------------------------------------
    def enqueue(self, requests: list) -> list[int]:
        with self._cond:
            if self.shutdown_called:
                raise RuntimeError("Shutdown called, cannot enqueue requests")
            full = f"Maximum queue size of {self._max_queue} has been reached, please try again later"
            overflow = bool(self._max_queue) and len(self._queue) + len(requests) > self._max_queue
            if overflow and not self._orchestrator:
                raise RuntimeError(full)
            ids = []
            for request in requests:
                ids.append(self._next_id)
                if overflow:  # orchestrator mode: the leader answers through the response path (reference §9)
                    self._responses.append(self._make_response(self._next_id, error=full))
                    self._terminated.add(self._next_id)
                    self._next_id += 1
                    continue
                self._queue.append((self._next_id, request))
                self._arrivals[self._next_id] = now()
                self._next_id += 1
            self._queue.sort(key=lambda item: -item[1]._priority_value)  # stable: FIFO within a priority
            self._cond.notify_all()
            return ids

    def await_responses(self, ids: list[int] | None, timeout_s: float | None) -> list:
        with self._cond:
            self._check_running()
            if ids is not None and ids[0] in self._terminated and not self._has(ids):
                return [self._make_response(ids[0], error=f"ReqId {ids[0]} has already been processed and was terminated.")]
            self._cond.wait_for(lambda: self.shutdown_called or self._has(ids), timeout_s)
            taken = [r for r in self._responses if ids is None or r.request_id in ids]
            self._responses = [r for r in self._responses if not (ids is None or r.request_id in ids)]
            return taken

    def _has(self, ids) -> bool:
        return any(ids is None or r.request_id in ids for r in self._responses)

    def num_responses_ready(self, request_id: int | None) -> int:
        with self._cond:
            self._check_running()
            return sum(1 for r in self._responses if request_id is None or r.request_id == request_id)

    def cancel(self, request_id: int) -> None:
        with self._cond:
            self._check_running()
            if request_id not in self._terminated:
                self._cancelled.add(request_id)

    def drain_stats(self) -> list:
        with self._cond:
            self._check_running()
            stats, self._stats = self._stats, []
            return stats

    def shutdown(self) -> None:
        """In leader mode (one GPU) it drains, as TensorRT-LLM's does: the terminate request waits behind the work,
        so this returns once every queued and active request has finished. In orchestrator mode it does not
        (reference §9): the leader acknowledges at once and later responses are never sent. From its start the
        API methods raise."""
        with self._cond:
            if self.shutdown_called:
                return
            self.shutdown_called = True
            self._cond.notify_all()
        self._thread.join()

    def _check_running(self) -> None:
        if self.shutdown_called:
            raise RuntimeError("Shutdown called")

    # -- the loop thread -----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.shutdown_called or self._queue or self._active)
                if self.shutdown_called and (self._orchestrator or not (self._queue or self._active)):
                    return
                started = time.perf_counter()
                responses, admitted = self._admit()
                finished = self._step(responses)
                self._record_stats(started, admitted, finished)
                for response in responses:
                    if response.has_error() or response.result.is_final:
                        self._terminated.add(response.request_id)
                        self.finish_reasons[response.request_id] = (
                            "error" if response.has_error() else response.result.finish_reasons[0].name)
                self._responses.extend(responses)
                self._cond.notify_all()
                busy = bool(self._active)
            if busy:
                self._wake.wait(STEP_S)  # the step's compute time

    def _admit(self) -> tuple[list, int]:
        responses, admitted = [], 0
        while self._queue and len(self._active) < self._max_batch:
            request_id, request = self._queue.pop(0)
            arrived = self._arrivals.pop(request_id)
            try:
                sequence = self._sequence(request_id, request)
            except GrammarFailure as exc:  # reaches the executor's catch-all: every active request fails
                error = f"Encountered an error in the guided decoder: {exc}"
                responses.extend(self._make_response(s.id, error=error) for s in self._active)
                responses.append(self._make_response(request_id, error=error))
                self._active = []
                continue
            except ValueError as exc:
                error = f"Encountered an error when fetching new request: {exc}"
                responses.append(self._make_response(request_id, error=error))
                continue
            self._allocate_kv_cache(sequence, arrived, request.output_config.return_perf_metrics)
            self._active.append(sequence)
            admitted += 1
        return responses, admitted

    def _sequence(self, request_id: int, request) -> Sequence:
        prompt, sampling = list(request.input_token_ids), request.sampling_config
        if not prompt:
            raise ValueError("the input token ids are empty")
        if len(prompt) > self.facts.max_input_len:
            raise ValueError(f"Prompt length ({len(prompt)}) exceeds maximum input length "
                             f"({self.facts.max_input_len}).")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be positive (got {request.max_tokens})")
        if sampling.beam_width != 1 or request._num_return_sequences != 1:
            raise ValueError("the test double generates one sequence per request (beam_width 1, one return sequence)")
        greedy = sampling.top_k == 1 or not sampling.top_p
        top_k = sampling.top_k or 0
        if top_k > MAX_TOP_K:
            print(f"[TensorRT-LLM][WARNING] TopK ({top_k}) is larger than max supported number ({MAX_TOP_K}). "
                  "Clip to max supported number.", file=sys.stderr)
            self.top_k_clipped.append(top_k)
            top_k = MAX_TOP_K
        bias = {}
        if request.embedding_bias is not None:
            values = request.embedding_bias.tolist()
            if len(values) != self.facts.vocab_size:
                raise ValueError(f"embedding_bias has {len(values)} entries, the vocabulary {self.facts.vocab_size}")
            bias = {token: value for token, value in enumerate(values) if value}
        wants_logits = request.output_config.return_generation_logits
        if wants_logits and not self._gather_logits:
            raise ValueError("generation logits were requested but the executor does not gather them "
                             "(ExecutorConfig.gather_generation_logits)")
        guided = None
        params = request.guided_decoding_params
        if params is not None:
            if self._guided is None:
                raise ValueError("guided decoding was requested but the executor has no guided_decoding_config")
            try:
                guided = self._guided.matcher(params.guide_type.name, params.guide)
            except Exception as exc:  # as in the C++ guided decoder: no per-request handling (reference §8)
                raise GrammarFailure(str(exc)) from exc
        return Sequence(
            id=request_id,
            prompt=prompt,
            max_new=min(request.max_tokens, self.facts.max_seq_len - len(prompt)),  # clamped, as the engine does
            end_id=request.end_id,
            stop_words=[list(word) for word in request.stop_words or []],
            streaming=request.streaming,
            exclude_input=request.output_config.exclude_input_from_output,
            log_probs=request.output_config.return_log_probs,
            min_tokens=1 if sampling.min_tokens is None else sampling.min_tokens,
            priority=request._priority_value,
            position=0 if greedy else (sampling.seed or 0) % len(prompt),
            bias=bias,
            logits_vocab=self.facts.vocab_size if wants_logits else 0,
            guided=guided,
            vocab_size=self.facts.vocab_size,
            top_k=top_k,
            normalize_log_probs=self._normalize_log_probs,
            cache_salt=request.cache_salt_id,
        )

    def _step(self, responses: list) -> int:
        """One token for every running request; cancelled ones end with an empty CANCELLED response."""
        self._iter += 1
        running, finished = [], 0
        fault = self.facts.fail_after_tokens
        if fault is not None and any(len(s.generated) + 1 >= fault for s in self._active):
            for sequence in self._active:
                error = "Encountered an error in forwardAsync function: simulated fault of the engine plan"
                responses.append(self._make_response(sequence.id, error=error))
            finished, self._active = len(self._active), []
            return finished
        for sequence in self._active:
            if sequence.id in self._cancelled:
                self._cancelled.discard(sequence.id)
                self._took_step(sequence, finished=True)
                responses.append(self._make_response(sequence.id, reason="CANCELLED", final=True,
                                                     decoding_iter=len(sequence.generated),
                                                     perf_metrics=sequence.perf and sequence.perf.metrics()))
                finished += 1
                continue
            self._store_new_block(sequence)
            reason = sequence.step()
            self._took_step(sequence, finished=reason is not None)
            response = self._respond(sequence, reason)
            if response is not None:
                responses.append(response)
            if reason is None:
                running.append(sequence)
            else:
                finished += 1
        self._active = running
        return finished

    def _respond(self, sequence: Sequence, reason: str | None):
        final = reason is not None
        if not sequence.streaming and not final:
            return None
        if sequence.streaming:
            tokens = sequence.generated[sequence.sent :]
        else:
            tokens = ([] if sequence.exclude_input else sequence.prompt) + sequence.generated
        sequence.sent = len(sequence.generated)
        if not tokens and not final:
            return None
        log_probs = list(sequence.probs) if sequence.log_probs else None  # every generated token so far
        logits = sequence.logits_tensor(len(tokens)) if sequence.logits_vocab and tokens and sequence.streaming else None
        return self._make_response(sequence.id, tokens=tokens, reason=reason, final=final, log_probs=log_probs,
                                   decoding_iter=len(sequence.generated), generation_logits=logits,
                                   perf_metrics=sequence.perf and sequence.perf.metrics())

    # -- the KV cache and stats ----------------------------------------------------------------------------------
    def _allocate_kv_cache(self, sequence: Sequence, arrived, wants_perf: bool) -> None:
        """When the request's first context chunk is scheduled: its context blocks, found in the prefix cache or
        missed, counted for the iteration stats and, where it asked, its perf metrics."""
        reuse = self._prefix.match(sequence.prompt, sequence.cache_salt)
        counters = self._counters
        counters["reused_blocks"] += reuse.reused
        counters["missed_blocks"] += reuse.missed
        counters["alloc_total_blocks"] += reuse.allocated
        counters["alloc_new_blocks"] += reuse.allocated
        if wants_perf:
            sequence.perf = PerfRecord(arrived, reuse=reuse)

    def _store_new_block(self, sequence: Sequence) -> None:
        """Before a generation step: the block the generated tokens just filled becomes reusable."""
        tokens = sequence.prompt + sequence.generated
        if sequence.context_done and (len(tokens) - 1) % self._prefix.tokens_per_block == 0:
            self._prefix.store(tokens, sequence.cache_salt, partial=False)

    def _took_step(self, sequence: Sequence, finished: bool) -> None:
        """After a step: the context's full blocks become reusable once it is computed, and every block of the
        sequence, the partial last one included, when it ends."""
        if not sequence.context_done:
            sequence.context_done = True
            self._prefix.store(sequence.prompt, sequence.cache_salt, partial=False)
        if finished:
            self._prefix.store(sequence.prompt + sequence.generated, sequence.cache_salt, partial=True)
        if sequence.perf is not None:
            sequence.perf.on_step(self._iter, finished)

    def _used_blocks(self) -> int:
        size = self.facts.tokens_per_block
        used = sum(math.ceil((len(s.prompt) + len(s.generated)) / size) for s in self._active)
        return min(used, self.max_blocks)

    def _record_stats(self, started: float, admitted: int, finished: int) -> None:
        latency_ms = max((time.perf_counter() - started) * 1000, STEP_S * 1000)
        self._append_stats(latency_ms, admitted, finished)
        if not self._active:  # the batch ran empty: one more entry, so an idle engine reports itself idle
            self._append_stats(0.0, 0, 0)

    def _append_stats(self, latency_ms: float, admitted: int, finished: int) -> None:
        used = self._used_blocks()
        reused, missed = self._counters["reused_blocks"], self._counters["missed_blocks"]
        kv = dict(self._counters, max_num_blocks=self.max_blocks, free_num_blocks=self.max_blocks - used,
                  used_num_blocks=used, tokens_per_block=self.facts.tokens_per_block,
                  cache_hit_rate=reused / (reused + missed) if reused + missed else 0.0)
        values = dict(timestamp=time.strftime("%m-%d-%Y %H:%M:%S"), iter=self._iter, iter_latency_ms=latency_ms,
                      num_new_active_requests=admitted, num_active_requests=len(self._active),
                      num_queued_requests=len(self._queue), num_completed_requests=finished,
                      max_num_active_requests=self._max_batch)
        batching = dict(num_scheduled_requests=len(self._active), num_gen_requests=len(self._active),
                        num_context_requests=admitted, avg_num_decoded_tokens_per_iter=1.0)
        self._stats.append(self._make_stats(values, kv, batching))
        if len(self._stats) > self._stats_kept:
            del self._stats[: len(self._stats) - self._stats_kept]
