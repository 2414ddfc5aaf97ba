"""The llamacpp backend's engine loop: one llama.cpp context, many sequences, one `llama_decode` per step.

It runs on its own thread. Requests and cancellations arrive through an inbox (filled on the worker's event
loop); each step the loop takes them in, admits waiting requests into free sequence slots (reusing cached
prefixes, llamacpp/cache.py), plans the batch (llamacpp/step.py), makes room in the KV cache, decodes, samples
every row that has logits (llamacpp/sampling.py), and hands the step's deltas to `deliver` in one call. When
nothing is running it waits on an event; nothing polls.

KV cells are the memory: `n_ctx` cells, either a stream of its own per sequence slot or one pool shared by all
(llamacpp/slots.py). Finished sequences keep their cells as a cached prefix. In a shared pool the least recently
used prefixes are dropped when room is needed, and if running sequences alone need more cells than there are,
the most recently admitted one is preempted: its cells are dropped and it waits at the head of the queue with
the tokens it has generated, to be recomputed (its draws depend only on its seed and positions, so its output
does not change).

A step's batch lists its rows in sequence-id order: with a stream per slot, llama.cpp computes a step as few
sub-batches as the ids allow only when each sub-batch's sequences are consecutive ids in batch order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from orchestrator.backends.llamacpp.api import Context
from orchestrator.backends.llamacpp.cache import RamPromptCache, Slot, place, worth_saving
from orchestrator.backends.llamacpp.sampling import SequenceSampler, TokenConstraint, sample
from orchestrator.backends.llamacpp.slots import SlotTable
from orchestrator.backends.llamacpp.step import PREFILL_WHILE_DECODING, StepPlan, plan_step
from orchestrator.backends.llamacpp.threads import ThreadTuner
from orchestrator.backends.protocol import BackendStats
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import ContextLengthExceeded, EngineError

log = logging.getLogger(__name__)


class Sequence:
    """One request while the engine holds it."""

    __slots__ = ("cached", "computed", "ends", "request", "sampler", "slot", "tokens")

    def __init__(self, request: EngineRequest, ends: frozenset[int], vocab: int):
        self.request = request
        self.ends = ends  # tokens that end it: end tokens unless ignored, and its stop tokens
        end_ids = np.array(sorted(ends), dtype=np.int64)
        self.sampler = SequenceSampler(request, end_ids, vocab)
        self.tokens = list(request.prompt_ids)  # prompt, then every token generated
        self.computed = 0  # leading tokens whose KV is in its slot
        self.slot: Slot | None = None
        self.cached: int | None = None  # prompt tokens found cached, reported once with the next delta

    @property
    def left(self) -> int:
        return len(self.tokens) - self.computed

    @property
    def generated(self) -> int:
        return self.sampler.generated


@dataclass(frozen=True)
class EngineLimits:
    n_batch: int
    n_ubatch: int  # tokens of one pass: the most prompt tokens a step takes while anything decodes
    max_seq_len: int  # prompt + output of one sequence: the manifest's, or less when a slot holds fewer cells
    prompt_cache_bytes: int
    threads: ThreadTuner  # how many threads each step runs on
    prefill_while_decoding: int = PREFILL_WHILE_DECODING


class EngineLoop:
    """Owns the context once started; `submit` and `cancel` may be called from any thread."""

    def __init__(self, context: Context, limits: EngineLimits, end_tokens: frozenset[int],
                 deliver: Callable[[list[TokenDelta]], None], die: Callable[[str], None]):
        self._ctx = context
        self._limits = limits
        self._end_tokens = end_tokens
        self._deliver = deliver
        self._die = die
        self._table = SlotTable(context)
        self._ram = RamPromptCache(limits.prompt_cache_bytes)
        self._inbox: deque = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._waiting: deque[Sequence] = deque()
        self._running: dict[str, Sequence] = {}  # by request id, in admission order
        self._retired: list[Slot] = []  # slots freed whose state is not yet copied to the RAM cache
        self._step = 0
        self._reused_tokens = 0
        self.preemptions = 0
        self._latency_ms: float | None = None
        self._numbers = self._count()  # the stats' numbers after the latest step, as one tuple (read on the event loop)
        self._thread = threading.Thread(target=self._run, name="llamacpp-engine", daemon=True)

    # -- from the worker's event loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, request: EngineRequest, constraint: TokenConstraint | None = None) -> None:
        """Queue a request; `constraint` is its grammar (structured outputs), already compiled."""
        self._inbox.append(("submit", (request, constraint)))
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        self._inbox.append(("cancel", request_id))
        self._wake.set()

    def stop(self) -> None:
        """Ask the loop to end after its current step; `join` waits for it."""
        self._stopping = True
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the engine thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                if not self._running and not self._waiting:
                    self._wake.wait()
                self._wake.clear()
                deltas: dict[str, TokenDelta] = {}
                self._take_inbox(deltas)
                if self._stopping:
                    return
                self._admit(deltas)
                if self._running:
                    self._run_step(deltas)
                self._numbers = self._count()
                if deltas:
                    self._deliver(list(deltas.values()))
                self._save_retired()
        except Exception as exc:  # a bug or a llama.cpp failure: nothing more can be trusted
            log.exception("the llamacpp engine loop failed")
            self._die(f"the llama.cpp engine loop failed: {type(exc).__name__}: {exc}")

    def _take_inbox(self, deltas: dict[str, TokenDelta]) -> None:
        while self._inbox:
            kind, value = self._inbox.popleft()
            if kind == "submit":
                request, constraint = value
                sequence = Sequence(request, self._ends(request), self._ctx.n_vocab)
                sequence.sampler.constraint = constraint
                self._enqueue(sequence)
            else:
                self._cancel(value, deltas)

    def _ends(self, request: EngineRequest) -> frozenset[int]:
        ends = frozenset(request.stop_token_ids)
        return ends if request.ignore_eos else ends | self._end_tokens

    def _enqueue(self, sequence: Sequence) -> None:
        """Waiting requests run in order of priority (higher first), then arrival."""
        priority = sequence.request.priority
        index = len(self._waiting)
        while index > 0 and self._waiting[index - 1].request.priority < priority:
            index -= 1
        self._waiting.insert(index, sequence)

    def _cancel(self, request_id: str, deltas: dict[str, TokenDelta]) -> None:
        sequence = self._running.get(request_id)
        if sequence is not None:
            self._retire(sequence)
        else:
            sequence = next((s for s in self._waiting if s.request.id == request_id), None)
            if sequence is None:
                return  # finished already, or never seen
            self._waiting.remove(sequence)
        self._delta(deltas, sequence).finish = FinishReason.CANCELLED

    @staticmethod
    def _delta(deltas: dict[str, TokenDelta], sequence: Sequence) -> TokenDelta:
        rid = sequence.request.id
        delta = deltas.get(rid)
        if delta is None:
            delta = deltas[rid] = TokenDelta(rid)
            if sequence.request.logprobs:
                delta.logprobs, delta.top_logprobs = [], []
        if sequence.cached is not None:
            delta.cached_tokens, sequence.cached = sequence.cached, None
        return delta

    # -- admission and KV room ---------------------------------------------------------------------------------
    def _admit(self, deltas: dict[str, TokenDelta]) -> None:
        self._save_retired()  # slots freed by cancellations just now, before one of them is reused
        while self._waiting:
            free = self._table.free()
            if not free:
                return
            sequence = self._waiting[0]
            needed = len(sequence.tokens) + 1
            if needed > self._table.seq_cells:
                self._waiting.popleft()
                self._fail(deltas, sequence, ContextLengthExceeded(
                    f"the sequence needs {needed} KV cells and one sequence of this model's cache holds "
                    f"{self._table.seq_cells}"))
                continue
            if not self._table.can_admit(needed, bool(self._running)):
                return  # it waits for running sequences to finish
            self._waiting.popleft()
            self._place(sequence, free)

    def _place(self, sequence: Sequence, free: list[Slot]) -> None:
        tokens, salt = tuple(sequence.tokens), sequence.request.cache_salt
        running = frozenset() if self._table.unified else frozenset(s.slot.seq for s in self._running.values())
        placement = place(tokens, salt, free, self._ram.keys(salt), running)
        slot, reuse = placement.slot, placement.reuse
        if placement.restore is not None and not self._restore(slot, salt, placement.restore):
            slot, reuse = placement.slot, 0
        self._table.truncate(slot, reuse)
        slot.owner, slot.last_used, slot.salt = sequence.request.id, self._step, salt
        sequence.slot, sequence.computed = slot, reuse
        if sequence.cached is None and sequence.generated == 0:
            sequence.cached = reuse
        self._reused_tokens += reuse
        self._running[sequence.request.id] = sequence

    def _restore(self, slot: Slot, salt: str, tokens: tuple[int, ...]) -> bool:
        self._table.truncate(slot, 0)
        if not self._table.make_room(len(tokens), keep=slot):
            return False
        if not self._ctx.set_seq_state(slot.seq, self._ram.take(salt, tokens)):
            self._ctx.seq_truncate(slot.seq, 0)
            return False
        slot.tokens.extend(tokens)
        return True

    def _preempt_newest(self) -> bool:
        """Give the cells of the most recently admitted running sequence back; False if only one runs."""
        if len(self._running) < 2:
            return False
        sequence = self._running.pop(next(reversed(self._running)))
        slot = sequence.slot
        self._table.truncate(slot, 0)
        slot.owner, sequence.slot, sequence.computed = None, None, 0
        self._waiting.appendleft(sequence)  # it resumes first
        self.preemptions += 1
        log.info("preempted %s: the KV cache is full; it resumes when room frees", sequence.request.id)
        return True

    # -- one step ----------------------------------------------------------------------------------------------
    def _plan(self, deltas: dict[str, TokenDelta]) -> StepPlan | None:
        """The step's plan, after making room for it (dropping cached prefixes, then preempting)."""
        while True:
            pending = [(rid, s.left) for rid, s in self._running.items()]
            plan = plan_step(pending, self._limits.n_batch, self._limits.prefill_while_decoding,
                             self._limits.n_ubatch)
            if self._table.make_room(plan.tokens):
                return plan
            if not self._preempt_newest():
                lone = next(iter(self._running.values()))
                self._finish(deltas, lone, FinishReason.LENGTH)  # it alone fills the cache
                return None

    def _run_step(self, deltas: dict[str, TokenDelta]) -> None:
        plan = self._plan(deltas)
        if plan is None or not plan.tokens:
            return
        batch_rows = self._rows(plan)
        rows = self._fill_batch(batch_rows)
        threads = self._limits.threads.choose(plan.tokens)
        self._ctx.set_threads(threads)
        started = time.perf_counter()
        status = self._ctx.decode(plan.tokens)
        if status == 1:  # llama.cpp found no room after all: free more and try again next step
            if not self._preempt_newest() and not self._table.drop_idle():
                for sequence in list(self._running.values()):
                    self._fail(deltas, sequence, EngineError("the KV cache has no room for this sequence"))
            return
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status}")
        took = time.perf_counter() - started
        self._limits.threads.observe(plan.tokens, threads, took)
        self._latency_ms = took * 1000
        self._step += 1
        self._advance(batch_rows)
        self._sample(rows, deltas)

    def _rows(self, plan: StepPlan) -> list[tuple[Sequence, int]]:
        """The plan's sequences and how many tokens each computes now, in sequence-id order."""
        rows = [(self._running[rid], 1) for rid in plan.decode]
        rows += [(self._running[rid], count) for rid, count in plan.prefill]
        return sorted(rows, key=lambda row: row[0].slot.seq)

    def _fill_batch(self, batch_rows: list[tuple[Sequence, int]]) -> list[Sequence]:
        """Write the step's rows into the batch arrays; returns the sequences whose rows ask for logits, in
        order."""
        batch, at, rows = self._ctx.batch, 0, []
        batch.logits[: sum(count for _, count in batch_rows)] = 0
        for sequence, count in batch_rows:
            start = sequence.computed
            batch.token[at : at + count] = sequence.tokens[start : start + count]
            batch.pos[at : at + count] = np.arange(start, start + count, dtype=np.int32)
            batch.seq[at : at + count] = sequence.slot.seq
            if start + count == len(sequence.tokens):
                batch.logits[at + count - 1] = 1
                rows.append(sequence)
            at += count
        return rows

    def _advance(self, batch_rows: list[tuple[Sequence, int]]) -> None:
        for sequence, count in batch_rows:
            start = sequence.computed
            sequence.slot.tokens.extend(sequence.tokens[start : start + count])
            sequence.slot.last_used = self._step
            sequence.computed += count

    def _sample(self, rows: list[Sequence], deltas: dict[str, TokenDelta]) -> None:
        if not rows:
            return
        logits = self._ctx.logits(len(rows))
        choices = sample(logits, [sequence.sampler for sequence in rows])
        for sequence, choice in zip(rows, choices, strict=True):
            if choice.error is not None:
                self._fail(deltas, sequence, EngineError(choice.error))
                continue
            self._take(sequence, choice, deltas)

    def _take(self, sequence: Sequence, choice, deltas: dict[str, TokenDelta]) -> None:
        """Keep the sampled token, or end the sequence on it."""
        request, token, sampler = sequence.request, choice.token, sequence.sampler
        delta = self._delta(deltas, sequence)
        if token in sequence.ends and sampler.generated >= request.min_tokens:
            self._finish(deltas, sequence, FinishReason.STOP)
            return
        try:
            sampler.accept(token)
        except Exception as exc:  # its constraint refused the token: this sequence ends, the others go on
            self._fail(deltas, sequence, EngineError(f"sampling failed: {type(exc).__name__}: {exc}"))
            return
        sequence.tokens.append(token)
        delta.token_ids.append(token)
        if request.logprobs:
            delta.logprobs.append(choice.logprob)
            delta.top_logprobs.append(choice.top or [])
        if sampler.generated >= request.max_new_tokens or len(sequence.tokens) >= self._limits.max_seq_len:
            self._finish(deltas, sequence, FinishReason.LENGTH)

    # -- endings -----------------------------------------------------------------------------------------------
    def _finish(self, deltas: dict[str, TokenDelta], sequence: Sequence, reason: FinishReason) -> None:
        self._retire(sequence)
        self._delta(deltas, sequence).finish = reason

    def _fail(self, deltas: dict[str, TokenDelta], sequence: Sequence, error: Exception) -> None:
        self._retire(sequence)
        delta = self._delta(deltas, sequence)
        delta.finish, delta.error = FinishReason.ERROR, error
        delta.token_ids, delta.logprobs, delta.top_logprobs = [], None, None

    def _retire(self, sequence: Sequence) -> None:
        """Free the sequence's slot; its cells stay as a cached prefix, and a copy of its state goes to RAM once
        the step's deltas are handed over (`_save_retired`)."""
        self._running.pop(sequence.request.id, None)
        slot = sequence.slot
        if slot is None:
            return
        slot.owner, slot.last_used, sequence.slot = None, self._step, None
        if self._ram.budget_bytes:
            self._retired.append(slot)

    def _save_retired(self) -> None:
        """Copy the states of the slots freed since the last call to the RAM cache: after the step's deltas are
        handed over (a finished request's last tokens do not wait for the copy, ~3 MB for 128 tokens of the
        default model) and before anything can be admitted into those slots."""
        for slot in self._retired:
            if worth_saving(slot.tokens, self._ram.keys(slot.salt)):
                self._ram.put(slot.salt, tuple(slot.tokens), self._ctx.seq_state(slot.seq))
        self._retired.clear()

    def _count(self) -> tuple:
        """Taken once per step on the engine thread (a tuple, so `snapshot` never sees half of one step)."""
        waiting = len(self._waiting) + len(self._inbox)
        return (len(self._running), waiting, self._table.cells_running(), self._step, self._reused_tokens,
                self._latency_ms)

    @property
    def snapshot(self) -> BackendStats:
        """The engine's stats after its latest step (called from the worker's event loop)."""
        running, waiting, used, step, reused, latency_ms = self._numbers
        n_ctx = self._table.n_ctx
        return BackendStats(running=running, waiting=waiting, kv_blocks_total=n_ctx, kv_blocks_free=n_ctx - used,
                            kv_blocks_used=used, tokens_per_block=1, iterations=step, kv_blocks_reused=reused,
                            iteration_latency_ms=latency_ms)
