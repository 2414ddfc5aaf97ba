"""The `llamacpp` backend: a GGUF model on llama.cpp's C API, continuously batched. The CPU default's speed.

One llama.cpp context holds every sequence, in KV cells bought by the byte budget the server assigns: a stream
per sequence slot when the budget holds every slot at full length, else one pool shared by all (`kv_layout`);
the engine loop (llamacpp/engine.py) runs one batched `llama_decode` per step on its own thread and hands each
step's deltas over in one `EngineOutputs.step` call, made on that thread where the outputs take calls from any
thread (the worker's do), else on the worker's event loop. Sampling is per sequence, in numpy
(llamacpp/sampling.py); prefixes are reused from free sequence slots and from a host-RAM prompt cache
(llamacpp/cache.py). Every llama.cpp call lives in llamacpp/api.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass

from orchestrator.backends.llamacpp.step import STEP_UBATCHES
from orchestrator.backends.llamacpp.threads import ThreadTuner
from orchestrator.backends.options import prompt_cache_budget
from orchestrator.backends.protocol import (
    BackendSettings,
    BackendStats,
    EngineOutputs,
    LoadReport,
    RequestStreams,
    hand_over,
    warm_up,
)
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import BackendUnavailable, EngineDead, EngineError

log = logging.getLogger(__name__)

MODEL_FILE = "model.gguf"
STOP_TIMEOUT_S = 30.0
CELL_PADDING = 256  # llama.cpp rounds a context's cells to a multiple of this


def preload() -> None:
    """Import the bindings and load libllama (a spare worker does this while it waits)."""
    from orchestrator.backends.llamacpp.api import bindings

    bindings()


def create(settings: BackendSettings) -> LlamaCppBackend:
    try:
        from orchestrator.backends.llamacpp import api as llamacpp_api

        version = llamacpp_api.binding_version()
    except ImportError as exc:
        raise BackendUnavailable(_missing(exc.name)) from exc
    checked = settings.manifest.build.tools.get("llama_cpp_python")
    if checked and checked != version:
        log.warning("%s was checked with llama-cpp-python %s; this worker runs %s",
                    settings.engine_dir.name, checked, version)
    return LlamaCppBackend(settings)


def _missing(name: str | None) -> str:
    from orchestrator.backends.llamacpp.api import PINNED_BINDING

    return (f"the llamacpp backend needs llama-cpp-python=={PINNED_BINDING}, and {name} is not installed: "
            "pip install 'inferno[llamacpp]' (it compiles llama.cpp for this CPU, about 3 minutes on 2 cores)")


def step_threads(configured: int | None, cores: int) -> ThreadTuner:
    """The threads llama.cpp's steps run on: `--worker.threads` for every step when given; else all cores but one
    or all of them, whichever the steps of each size run faster on (threads.py)."""
    return ThreadTuner.fixed(configured) if configured else ThreadTuner.default(cores)


def kv_cells(settings: BackendSettings) -> int:
    """The KV cells the byte budget buys (a multiple of llama.cpp's padding, at least one sequence's worth)."""
    manifest = settings.manifest
    cells = settings.kv_cache_bytes // manifest.kv_cache.bytes_per_token
    cells = cells // CELL_PADDING * CELL_PADDING
    return max(cells, CELL_PADDING)


def prompt_cache_bytes(settings: BackendSettings) -> int:
    """The RAM prompt cache's budget: the option when given, else half the KV cache budget. It fills up to its
    budget as requests finish (each keeps a copy of its KV cells, 23 KB a token for SmolLM2), so the worker's
    memory grows by that much, then holds."""
    return prompt_cache_budget("llamacpp", settings.options.prompt_cache_bytes, settings.kv_cache_bytes)


@dataclass(frozen=True)
class KvLayout:
    """How a context's cells are laid out, and why."""

    unified: bool
    slots: int
    cells: int  # in all
    reason: str

    @property
    def seq_cells(self) -> int:
        """The most cells one sequence can hold."""
        return self.cells if self.unified else self.cells // self.slots


def kv_layout(budget_cells: int, max_batch_size: int, max_seq_len: int) -> KvLayout:
    """A stream per slot when the budget holds every slot at the engine's `max_seq_len`; else one pool.

    In llama.cpp's unified cache every token of a step attends over every cell up to the highest in use (other
    sequences' and cached prefixes' included, masked out), so a step costs more the more the pool holds: 16
    decoding sequences of 140 tokens took 14.5 ms per token unified against 11.9 with a stream each
    (docs/llamacpp.md). A stream per slot costs nothing extra when every slot can hold a whole sequence; with
    less memory than that, one pool lets a long request use what the others leave."""
    slot_cells = -(-max_seq_len // CELL_PADDING) * CELL_PADDING
    full = max_batch_size * slot_cells
    if budget_cells >= full:
        return KvLayout(False, max_batch_size, full,
                        f"the budget holds all {max_batch_size} slots at {slot_cells} cells: a stream per slot")
    return KvLayout(True, max_batch_size, budget_cells,
                    f"{budget_cells} cells hold fewer than {max_batch_size} slots of {slot_cells}: one pool "
                    f"shared by all slots")


class LlamaCppBackend:
    def __init__(self, settings: BackendSettings):
        self._settings = settings
        self._manifest = settings.manifest
        self._model = None
        self._context = None
        self._engine = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outputs: EngineOutputs | None = None
        self._dead: str | None = None
        self._grammars = None  # structured.grammar.matcher.GrammarCache, made with the first constrained request
        self._grammar_lock = threading.Lock()
        self._compiling: set[str] = set()  # constrained requests whose grammar is compiling, not yet submitted

    async def start(self, outputs: EngineOutputs) -> LoadReport:
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._load)
        warming = RequestStreams(self)
        self._outputs = warming
        self._engine.start()
        await warm_up(warming, self._manifest.tokenizer.pad_token_id)
        self._outputs = outputs
        return LoadReport(device="cpu", reusable=True)  # close frees the context and the model (their memory)

    def _load(self) -> None:
        from orchestrator.backends.llamacpp.api import Context, ContextShape, Model
        from orchestrator.backends.llamacpp.engine import EngineLimits, EngineLoop

        settings, manifest = self._settings, self._manifest
        limits = manifest.limits
        self._model = Model(settings.engine_dir / MODEL_FILE)
        layout = kv_layout(kv_cells(settings), limits.max_batch_size, limits.max_seq_len)
        threads = step_threads(settings.options.threads, os.cpu_count() or 1)
        shape = ContextShape(n_ctx=layout.cells, n_batch=limits.max_num_tokens * STEP_UBATCHES,
                             n_ubatch=limits.max_num_tokens, n_seq_max=layout.slots, n_threads=threads.most,
                             unified=layout.unified)
        self._context = Context(self._model, shape)
        engine_limits = EngineLimits(n_batch=shape.n_batch, n_ubatch=shape.n_ubatch,
                                     max_seq_len=min(limits.max_seq_len, layout.seq_cells),
                                     prompt_cache_bytes=prompt_cache_bytes(settings), threads=threads)
        ends = frozenset(manifest.tokenizer.eos_token_ids)
        self._engine = EngineLoop(self._context, engine_limits, ends, self._hand_over, self._hand_over_death)
        log.info("llama.cpp context: %d KV cells, %d sequences (%s), steps of up to %d tokens in passes of %d, %s",
                 self._context.n_ctx, shape.n_seq_max, layout.reason, shape.n_batch, shape.n_ubatch,
                 threads.describe())
        if layout.seq_cells < limits.max_seq_len:
            log.warning("%s: its KV budget holds %d cells; sequences end there, below the engine's max_seq_len %d",
                        settings.engine_dir.name, layout.seq_cells, limits.max_seq_len)

    # -- the engine thread's way back to the event loop -------------------------------------------------------
    def _hand_over(self, deltas: list[TokenDelta]) -> None:
        if getattr(self._outputs, "any_thread", False):
            self._outputs.step(deltas)  # the worker sends the step's frame from this thread
        else:
            hand_over(self._loop, self._deliver, deltas)

    def _hand_over_death(self, reason: str) -> None:
        hand_over(self._loop, self._die, reason)

    def _deliver(self, deltas: list[TokenDelta]) -> None:
        if self._dead is None:
            self._outputs.step(deltas)

    def _die(self, reason: str) -> None:
        if self._dead is None:
            self._dead = reason
            self._outputs.dead(reason)

    # -- the protocol ------------------------------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        if self._dead is not None:
            raise EngineDead(f"the llama.cpp engine stopped: {self._dead}")
        if request.guide is None:
            self._engine.submit(request)
            return
        # Its grammar compiles off the event loop (cached after the first time), then it joins the engine.
        self._compiling.add(request.id)
        self._loop.create_task(self._submit_guided(request), name=f"grammar-{request.id}")

    async def _submit_guided(self, request: EngineRequest) -> None:
        try:
            constraint = await asyncio.to_thread(self._constraint, request)
        except Exception as exc:
            if request.id in self._compiling:
                self._compiling.discard(request.id)
                error = EngineError(f"the request's grammar did not compile in the engine: {exc}")
                self._deliver([TokenDelta(request.id, finish=FinishReason.ERROR, error=error)])
            return
        if request.id not in self._compiling:
            return  # cancelled while it compiled: its final delta has been delivered
        self._compiling.discard(request.id)
        if self._dead is not None:
            return  # the worker has failed every request it held
        self._engine.submit(request, constraint)

    def _constraint(self, request: EngineRequest):
        """The request's grammar as a token constraint (on a worker thread: a first compile takes a while)."""
        from orchestrator.structured.grammar.matcher import GrammarCache, RowConstraint
        from orchestrator.structured.vocabulary import load_vocabulary

        with self._grammar_lock:
            if self._grammars is None:
                ends = tuple(sorted(self._manifest.tokenizer.eos_token_ids))
                self._grammars = GrammarCache(load_vocabulary(self._settings.engine_dir, stop_token_ids=ends))
        return RowConstraint(self._grammars.new_state(request.guide), self._grammars.vocabulary.size)

    def cancel(self, request_id: str) -> None:
        if request_id in self._compiling:  # never reached the engine
            self._compiling.discard(request_id)
            self._loop.call_soon(self._deliver, [TokenDelta(request_id, finish=FinishReason.CANCELLED)])
            return
        if self._engine is not None and self._dead is None:
            self._engine.cancel(request_id)

    def stats(self) -> BackendStats:
        return BackendStats(0, 0, 0, 0, 0, 1, 0) if self._engine is None else self._engine.snapshot

    async def close(self) -> None:
        if self._engine is not None:
            self._engine.stop()
            await asyncio.to_thread(self._engine.join, STOP_TIMEOUT_S)
            if self._engine.alive:  # still inside a decode: the process exit frees it all
                return
        if self._context is not None:
            self._context.free()
        if self._model is not None:
            self._model.free()
