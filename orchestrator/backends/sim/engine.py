"""The simulated engine's state machine: requests in, one step at a time out. No threads and no clock: the
backend (orchestrator/backends/sim/backend.py) calls `step()` and sleeps for the simulated time it returns.

Each step admits what fits (batching.admit), schedules decode rows and prefill chunks (batching.schedule),
prices the step with the step-time model, and advances every scheduled sequence: a decoding sequence
generates one token, a prefill chunk moves its prompt into the KV cache, and the chunk that completes a prompt
also generates the sequence's first token, as TensorRT-LLM's context phase does. Prompt blocks copied back from
the host tier at admission add their transfer time to the step that admits them: the copy must land before the
prefill reads it. Offloads to the host are not priced: they run on a copy stream while steps compute.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from orchestrator.backends.protocol import BackendStats
from orchestrator.backends.sim.batching import BatchLimits, admit, blocks_for, schedule
from orchestrator.backends.sim.blocks import BlockPool, prefix_hashes
from orchestrator.backends.sim.sequence import Sequence
from orchestrator.backends.sim.step_time import StepCoefficients
from orchestrator.engine.manifest import Limits
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter


@dataclass
class StepResult:
    step_ms: float  # simulated duration of the step; 0 when nothing was scheduled
    deltas: list[TokenDelta] = field(default_factory=list)
    scheduled: bool = False  # the step ran a forward pass (some decode row or prefill chunk)


class SimEngine:
    def __init__(self, coefficients: StepCoefficients, limits: Limits, tokens_per_block: int, kv_blocks: int,
                 corpus: tuple[int, ...], natural_length: int, host_blocks: int = 0,
                 onboard_ms_per_block: float = 0.0, retain_system_prompt: bool = False):
        self.coefficients = coefficients
        self.limits = limits
        self.batch = BatchLimits(limits.max_batch_size, limits.max_num_tokens, tokens_per_block)
        self.pool = BlockPool(kv_blocks, host_blocks)
        self.onboard_ms_per_block = onboard_ms_per_block  # one block's copy from host RAM to the GPU
        self.retain_system_prompt = retain_system_prompt
        self.corpus = corpus
        self.natural_length = natural_length
        self.waiting: list[Sequence] = []  # best first
        self.prefilling: list[Sequence] = []  # admitted, prompt not all in the KV cache yet; in admission order
        self.decoding: list[Sequence] = []  # generating one token per step
        self._by_id: dict[str, Sequence] = {}
        self._pending: list[TokenDelta] = []  # final deltas of cancelled requests, sent with the next step
        self._arrivals = 0
        self.iterations = 0

    # -- requests in -----------------------------------------------------------------------------------
    def check(self, request: EngineRequest) -> None:
        """Raise the InfernoError for a request this engine cannot honour (before it is submitted)."""
        sampling, limits = request.sampling, self.limits
        if sampling.logit_bias:
            raise UnsupportedParameter("logit_bias is not supported by the sim backend", param="logit_bias")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(sampling, name):
                raise UnsupportedParameter(
                    f"{name} is not supported by the sim backend (got {getattr(sampling, name)}; only 0)", param=name
                )
        if sampling.repetition_penalty != 1.0:
            raise UnsupportedParameter(
                f"repetition_penalty is not supported by the sim backend (got {sampling.repetition_penalty}; only 1)",
                param="repetition_penalty",
            )
        prompt = len(request.prompt_ids)
        if not 1 <= prompt <= limits.max_input_len:
            raise ContextLengthExceeded(
                f"the prompt has {prompt} tokens; this model takes 1 to {limits.max_input_len}", param="messages"
            )
        tokens = prompt + min(request.max_new_tokens, limits.max_seq_len - prompt)
        tpb = self.batch.tokens_per_block
        if blocks_for(tokens, tpb) > self.pool.total:
            raise InvalidRequest(
                f"the prompt ({prompt} tokens) and max_tokens ({request.max_new_tokens}) need {tokens} tokens of KV "
                f"cache; this model's cache holds {self.pool.total * tpb}",
                param="max_tokens",
            )

    def add(self, request: EngineRequest) -> None:
        """Queue a checked request."""
        sequence = Sequence(request, self._arrivals, len(self.corpus), self.limits.max_seq_len, self.natural_length)
        self._arrivals += 1
        tpb = self.batch.tokens_per_block
        sequence.hashes = prefix_hashes(sequence.prompt, tpb, len(sequence.prompt) // tpb, request.cache_salt)
        if self.retain_system_prompt:  # every block the system prompt touches, as a retention token range does
            sequence.kept = blocks_for(request.system_prefix_tokens, tpb)
        # The waiting line runs by priority (highest first), then arrival.
        bisect.insort(self.waiting, sequence, key=lambda waiting: (-waiting.priority, waiting.order))
        self._by_id[sequence.id] = sequence

    def cancel(self, request_id: str) -> None:
        """End a request at the next step with a CANCELLED delta; unknown or finished ids are ignored."""
        sequence = self._by_id.pop(request_id, None)
        if sequence is None:
            return
        if not sequence.admitted:
            self.waiting.remove(sequence)
        elif sequence.prefilling:
            self.prefilling.remove(sequence)
            self._free(sequence)
        else:
            self.decoding.remove(sequence)
            self._free(sequence)
        self._pending.append(TokenDelta(request_id, finish=FinishReason.CANCELLED))

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def busy(self) -> bool:
        return bool(self.decoding or self.prefilling or self.waiting or self._pending)

    # -- one step -------------------------------------------------------------------------------------
    def step(self) -> StepResult:
        result = StepResult(0.0, self._pending)
        self._pending = []
        admitted = admit(self.waiting, self.running, self.pool, self.batch)
        self.prefilling += admitted
        rows = self.decoding
        chunks = schedule(len(rows), self.prefilling, self.batch)
        if not rows and not chunks:
            return result
        kv_tokens = sum(sequence.length for sequence in rows)
        result.step_ms = self.coefficients.step_ms(len(rows), kv_tokens, [(n, s.computed) for s, n in chunks])
        if admitted:
            result.step_ms += self.onboard_ms_per_block * sum(sequence.onboarded for sequence in admitted)
        result.scheduled = True
        self.iterations += 1
        deltas, finished = result.deltas, []
        for sequence in rows:
            self._emit(sequence, deltas, finished)
        prefilled = [sequence for sequence, size in chunks if self._prefill(sequence, size)]
        for sequence in prefilled:
            self._emit(sequence, deltas, finished)
        if prefilled:
            self.prefilling = [sequence for sequence in self.prefilling if sequence.prefilling]
            rows += [sequence for sequence in prefilled if not sequence.done]
        if finished:
            for sequence in finished:
                del self._by_id[sequence.id]
                self._free(sequence)
            self.decoding = [sequence for sequence in rows if not sequence.done]
        return result

    def _prefill(self, sequence: Sequence, size: int) -> bool:
        """Move a chunk of the prompt into the KV cache; True when that completes the prompt."""
        tpb, pool = self.batch.tokens_per_block, self.pool
        before = sequence.computed
        sequence.computed += size
        sequence.length += size
        self._grow(sequence)
        for index in range(before // tpb, min(sequence.computed // tpb, len(sequence.hashes))):
            pool.register(sequence.blocks[index], sequence.hashes[index])
        return sequence.computed == len(sequence.prompt)

    def _grow(self, sequence: Sequence) -> None:
        tpb, pool, blocks = self.batch.tokens_per_block, self.pool, sequence.blocks
        while sequence.capacity < sequence.length:
            blocks.append(pool.allocate())
            sequence.capacity += tpb
            sequence.reserve_left -= 1

    def _emit(self, sequence: Sequence, deltas: list[TokenDelta], finished: list[Sequence]) -> None:
        """One token of one sequence (the hot path: one call per decoding sequence per step)."""
        token, finish = sequence.next_token(self.corpus)
        if token is None:
            delta = TokenDelta(sequence.id, [], finish)
        else:
            delta = TokenDelta(sequence.id, [token], finish)
            if sequence.length > sequence.capacity:
                self._grow(sequence)
        if sequence.extras:
            self._extras(sequence, token, delta)
        deltas.append(delta)
        if finish is not None:
            sequence.done = True
            finished.append(sequence)

    def _extras(self, sequence: Sequence, token: int | None, delta: TokenDelta) -> None:
        """The cached prompt tokens, on a sequence's first delta; log probabilities, where asked."""
        request = sequence.request
        if not sequence.reported_cached:
            delta.cached_tokens = sequence.cached
            sequence.reported_cached = True
        sequence.extras = request.logprobs
        if not request.logprobs:
            return
        if token is None:
            delta.logprobs, delta.top_logprobs = [], ([] if request.top_logprobs else None)
            return
        logprob = sequence.logprob(token)
        delta.logprobs = [logprob]
        if request.top_logprobs:
            delta.top_logprobs = [sequence.top_logprobs(token, logprob, request.top_logprobs, self.corpus)]

    def _free(self, sequence: Sequence) -> None:
        self.pool.release(sequence.blocks, sequence.kept)
        self.pool.unreserve(sequence.reserve_left)
        sequence.blocks, sequence.reserve_left, sequence.capacity = [], 0, 0

    # -- what it reports ---------------------------------------------------------------------------------
    def stats(self, step_latency_ms: float | None = None) -> BackendStats:
        pool = self.pool
        return BackendStats(running=self.running, waiting=len(self.waiting), kv_blocks_total=pool.total,
                            kv_blocks_free=pool.free, kv_blocks_used=pool.used,
                            tokens_per_block=self.batch.tokens_per_block, iterations=self.iterations,
                            kv_blocks_reused=pool.reused, iteration_latency_ms=step_latency_ms)
