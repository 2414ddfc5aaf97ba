"""The `trtllm` backend: TensorRT-LLM 1.2's in-process C++ Executor over an AOT-built engine folder.

In-flight batching over a paged KV cache with prefix reuse and chunked prefill, sized by the byte budget
the server assigns. The Executor runs its own loop on its own threads; this backend enqueues requests,
cancels them, and reads stats on the worker's event loop, while one thread (trtllm_responses.ResponsePump)
blocks in `await_responses` and hands every batch of responses over in one call. Each request's stream
then yields only its new tokens, ending with a finish reason.

Engines built for several GPUs run in orchestrator mode: this worker process spawns TensorRT-LLM's
executorWorker for each rank and stays the one owner of the engine, so unloading the model is still
ending this process (see docs/tensorrt-llm.md for leader mode under MPI, the multi-node alternative).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import metadata

from tokenizers import Tokenizer

from orchestrator.backends.protocol import (
    BackendSettings,
    BackendStats,
    EngineOutputs,
    LoadReport,
    RequestStreams,
    warm_up,
)
from orchestrator.backends.trtllm.config import build_executor_config, engine_vocab_size, kv_cache_tokens
from orchestrator.backends.trtllm.requests import RequestBuilder
from orchestrator.backends.trtllm.responses import (
    ResponsePump,
    ResponseReader,
    Update,
    cached_prompt_tokens,
    top_alternatives,
)
from orchestrator.backends.trtllm.runtime import (
    Runtime,
    check_engine_matches_runtime,
    load_runtime,
    visible_gpus,
)
from orchestrator.backends.trtllm.stats import IterationStatsReader
from orchestrator.engine import trtllm_release as release
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import EngineDead, EngineError, InvalidRequest, QueueFull

log = logging.getLogger(__name__)



def create(settings: BackendSettings) -> TrtllmBackend:
    """Import TensorRT-LLM and refuse an engine built for another version or GPU, before loading anything."""
    runtime = load_runtime()
    check_engine_matches_runtime(settings.manifest, settings.engine_dir, runtime.version, visible_gpus())
    return TrtllmBackend(settings, runtime)


class _Running:
    """What the backend keeps per executor request while it runs."""

    __slots__ = ("end_tokens", "generated", "min_tokens", "name", "prompt_len", "reused_blocks", "stop_tokens",
                 "top_logprobs", "unreported")

    def __init__(self, name: str, request: EngineRequest, end_tokens: frozenset[int]):
        self.name = name
        self.top_logprobs = request.top_logprobs
        self.min_tokens = request.min_tokens
        self.stop_tokens = end_tokens  # one-token stop words: they end the answer and are not part of it
        self.end_tokens = end_tokens if request.min_tokens else frozenset()  # watched here, not by the engine
        self.generated = 0
        self.prompt_len = len(request.prompt_ids)
        self.reused_blocks: int | None = None  # the engine's count, from the request's first result
        self.unreported = True  # the cached prompt tokens are still to be told, on the first delta sent

    def note_reused(self, reused_blocks: int | None) -> None:
        if reused_blocks is not None:
            self.reused_blocks = reused_blocks

    def report_cached(self, delta: TokenDelta, tokens_per_block: int) -> None:
        """Put the cached prompt tokens on the first delta sent once the engine's count is known. Results without
        perf metrics tell nothing: the count stays unknown (None), never a made-up 0."""
        if self.unreported and self.reused_blocks is not None:
            delta.cached_tokens = cached_prompt_tokens(self.reused_blocks, tokens_per_block, self.prompt_len)
            self.unreported = False

    def drop_stop_token(self, delta: TokenDelta) -> None:
        """The engine puts the stop word it ended on into the output (reference: stop words are part of the
        output); a stop token, like the end token, ends the answer without being part of it."""
        if delta.finish is FinishReason.STOP and delta.token_ids and delta.token_ids[-1] in self.stop_tokens:
            delta.keep(len(delta.token_ids) - 1)

    def cut_at_end_token(self, delta: TokenDelta) -> bool:
        """End the delta at the first watched end token past min_tokens; True if one was found."""
        start, self.generated = self.generated, self.generated + len(delta.token_ids)
        if not self.end_tokens:
            return False
        for i, token in enumerate(delta.token_ids):
            if start + i >= self.min_tokens and token in self.end_tokens:
                delta.keep(i)
                delta.finish = FinishReason.STOP
                return True
        return False


class TrtllmBackend:
    def __init__(self, settings: BackendSettings, runtime: Runtime):
        self._settings = settings
        self._runtime = runtime
        self._trtllm = runtime.bindings
        manifest = settings.manifest
        max_tokens = kv_cache_tokens(settings)
        tokens_per_block = manifest.kv_cache.tokens_per_block
        self._tokens_per_block = tokens_per_block  # the engine's, fixed when it was built
        self._stats = IterationStatsReader(max_tokens // tokens_per_block, tokens_per_block)
        self._reader = ResponseReader(self._trtllm, manifest.tokenizer.eos_token_ids)
        self._requests: RequestBuilder | None = None
        self._executor = None
        self._pump: ResponsePump | None = None
        self._outputs: EngineOutputs | None = None
        self._running: dict[int, _Running] = {}  # executor request id -> what it is, while it runs
        self._ids: dict[str, int] = {}  # engine request id -> executor request id, while it runs
        self._failure: str | None = None
        self._guided_problem: str | None = None  # why guided decoding is off for this model, when it is
        self._closed = False

    async def start(self, outputs: EngineOutputs) -> LoadReport:
        trtllm, settings = self._trtllm, self._settings
        tokenizer = Tokenizer.from_file(str(settings.engine_dir / "tokenizer.json"))
        self._requests = RequestBuilder(trtllm, settings.manifest, tokenizer, engine_vocab_size(settings.engine_dir),
                                        retain_system_prompt=settings.options.retain_system_prompt)
        check_xgrammar_version()
        self._executor = await self._load_executor()
        try:
            loop = asyncio.get_running_loop()
            self._pump = ResponsePump(self._executor, self._reader, loop, self._deliver, self._fail)
            self._pump.start()
            warming = RequestStreams(self)
            self._outputs = warming
            await warm_up(warming, settings.manifest.tokenizer.pad_token_id)
            self._outputs = outputs
        except BaseException:
            await self.close()  # a load that fails half way still shuts the executor down
            raise
        world_size = settings.manifest.parallel.world_size
        mode = "orchestrator mode, one executorWorker per rank" if world_size > 1 else "one GPU"
        log.info("TensorRT-LLM %s executor started: %s (world size %d)", self._runtime.version, mode, world_size)
        return LoadReport(device="cuda:0" if world_size == 1 else f"cuda:0-{world_size - 1}")

    async def _load_executor(self):
        """The Executor, with guided decoding where its guided decoder can be built. That decoder is built once per
        executor over the model's vocabulary (reference §9), so a vocabulary xgrammar cannot read fails the whole
        load: the load is then retried without it, and only guided requests are refused (`submit`).

        The constructor holds the GIL for the whole load (reference §8): this worker's loop is frozen until it
        returns, the thread notwithstanding. Nothing waits on it meanwhile: the server sent the load and awaits
        one answer within its load timeout, shows the model as loading and serves everything else itself."""
        trtllm, settings = self._trtllm, self._settings
        model_type = trtllm.ModelType.DECODER_ONLY
        try:
            config = build_executor_config(trtllm, settings, self._runtime)
            return await asyncio.to_thread(trtllm.Executor, settings.engine_dir, model_type, config)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        config = build_executor_config(trtllm, settings, self._runtime, guided=False)
        executor = await asyncio.to_thread(trtllm.Executor, settings.engine_dir, model_type, config)
        self._guided_problem = problem  # the load works without it: guided decoding was the cause
        log.warning("guided decoding is off for this model: its setup failed at load (%s)", problem)
        return executor

    def submit(self, request: EngineRequest) -> None:
        if self._failure is not None:
            raise EngineDead(f"the TensorRT-LLM executor stopped: {self._failure}")
        if request.guide is not None and self._guided_problem is not None:
            raise InvalidRequest(
                f"this model serves no structured outputs: its guided decoding could not be set up when it was "
                f"loaded ({self._guided_problem})", param=request.guide.param or "response_format",
            )
        trt_request = self._requests.build(request)
        try:
            trt_id = self._executor.enqueue_request(trt_request)
        except Exception as exc:
            raise _enqueue_error(exc) from exc
        self._running[trt_id] = _Running(request.id, request, self._requests.end_tokens(request))
        self._ids[request.id] = trt_id

    def cancel(self, request_id: str) -> None:
        """The engine ends the request at its next step and still sends a final response (CANCELLED)."""
        trt_id = self._ids.get(request_id)
        if trt_id is None or self._executor is None or self._closed or self._failure is not None:
            return
        try:
            self._executor.cancel_request(trt_id)
        except Exception as exc:
            log.warning("cancelling executor request %d failed: %s", trt_id, exc)

    def _deliver(self, updates: list[Update]) -> None:
        """On the event loop: one engine step's responses (or a few), every request's, in one call."""
        deltas = []
        for update in updates:
            running = self._running.get(update.request_id)
            if running is None:
                continue  # not ours (any more)
            delta = update.delta
            delta.request_id = running.name
            running.note_reused(update.reused_blocks)
            if running.top_logprobs and update.logits is not None and delta.token_ids:
                delta.logprobs, delta.top_logprobs = top_alternatives(update.logits, delta.token_ids, running.top_logprobs)
            if running.cut_at_end_token(delta) and not update.final:
                self.cancel(running.name)  # ended here at a stop token: the engine's last words are dropped
                update.final = True
            if update.final:
                running.drop_stop_token(delta)
                del self._running[update.request_id]
                del self._ids[running.name]
            elif not delta.token_ids:
                continue
            running.report_cached(delta, self._tokens_per_block)
            deltas.append(delta)
        if deltas:
            self._outputs.step(deltas)

    def _fail(self, message: str) -> None:
        """On the event loop: the executor broke; nothing more comes from it."""
        self._failure = message
        self._running.clear()
        self._ids.clear()
        self._outputs.dead(f"the TensorRT-LLM executor stopped: {message}")

    def stats(self) -> BackendStats:
        """The one reader of the executor's iteration stats (reading drains them)."""
        if self._executor is None or self._closed or self._failure is not None:
            return self._stats.current
        try:
            return self._stats.read(self._executor.get_latest_iteration_stats())
        except Exception as exc:
            log.warning("reading the executor's iteration stats failed: %s", exc)
            return self._stats.current

    async def close(self) -> None:
        """Shut the executor down (its memory goes back when this worker process exits, right after).

        `shutdown()` drains: it waits for every active request to finish. So every live request is cancelled
        first, and the engine ends each at its next step."""
        if self._executor is None or self._closed:
            return
        for trt_id in list(self._running):
            with contextlib.suppress(Exception):
                self._executor.cancel_request(trt_id)
        self._closed = True
        if self._pump is not None:
            self._pump.stop()
        await asyncio.to_thread(self._executor.shutdown)  # blocking, releases the GIL; wakes the pump's wait
        if self._pump is not None:
            await asyncio.to_thread(self._pump.join)
        log.info("TensorRT-LLM executor shut down")


def check_xgrammar_version() -> None:
    """Warn when the Python xgrammar (the grammar checker's, which compiles every guide before admission) is not
    the one TensorRT-LLM's guided decoding is built with: a guide the checker accepts could then fail inside the
    engine, and that fails every running request of the model (reference §8)."""
    try:
        installed = metadata.version("xgrammar")
    except metadata.PackageNotFoundError:
        return
    if installed != release.XGRAMMAR_VERSION:
        log.warning("the grammar checker's xgrammar is %s, but TensorRT-LLM %s builds guided decoding with xgrammar "
                    "%s: a guide one accepts may fail in the other", installed, release.VERSION,
                    release.XGRAMMAR_VERSION)


def _enqueue_error(exc: Exception) -> Exception:
    text = str(exc)
    if "queue size" in text.lower():  # the executor's max_queue_size: a burst beyond what it holds
        return QueueFull(f"the engine's request queue is full; retry shortly ({text})", retry_after_s=1.0)
    return EngineError(f"the TensorRT-LLM executor refused the request: {text}")
