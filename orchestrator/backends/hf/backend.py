"""The `hf` backend: transformers' continuous batching manager with paged attention, on PyTorch.

Portable (CPU, CUDA, anything torch supports); the embedded default's model on PyTorch is `smollm2-135m-hf`.
The manager runs its own generation thread; every step's outputs reach this worker's event loop in one
`call_soon_threadsafe`, and become one `EngineOutputs.step` call with every request's new tokens.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from orchestrator.backends.hf.prefix import SaltedPrefixes
from orchestrator.backends.options import HfOptions
from orchestrator.backends.protocol import (
    BackendSettings,
    BackendStats,
    EngineOutputs,
    LoadReport,
    RequestStreams,
    hand_over,
    warm_up,
)
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams, TokenDelta
from orchestrator.errors import BackendUnavailable, EngineDead, EngineError

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


def preload() -> None:
    """Import what a load needs (torch, transformers, the Llama-family model code): most of a cold start."""
    import torch  # noqa: F401
    import transformers
    from transformers.generation.continuous_batching import continuous_api  # noqa: F401

    from orchestrator.backends.hf import sampling as hf_sampling  # noqa: F401

    transformers.AutoModelForCausalLM  # noqa: B018 (resolves the lazy module)
    transformers.LlamaForCausalLM  # noqa: B018


def create(settings: BackendSettings) -> HfBackend:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(
            f"the hf backend needs torch and transformers==5.23.0, and {exc.name} is not installed: "
            "pip install 'inferno[hf]'"
        ) from exc
    return HfBackend(settings)


class _StepRouter:
    """Stands in for the manager's output router: every step's outputs reach the worker's event loop in one
    `call_soon_threadsafe`, instead of one callback per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_outputs):
        self._loop = loop
        self._on_outputs = on_outputs

    def deliver_batch(self, outputs: list) -> None:
        hand_over(self._loop, self._on_outputs, outputs)

    def deliver(self, output) -> None:
        self.deliver_batch([output])

    def fail_and_deliver(self, state, error: Exception) -> None:
        from transformers.generation.continuous_batching.requests import RequestStatus

        state.status = RequestStatus.FAILED
        state.error = str(error)
        self.deliver(state.to_generation_output())


class _Live:
    """What the backend keeps per running request."""

    __slots__ = ("cached", "compiling", "eos", "logprobs", "salt", "sent")

    def __init__(self, eos: frozenset[int], logprobs: bool, salt: str = ""):
        self.eos = eos  # the tokens that end this request (end tokens unless ignored, plus its stop tokens)
        self.logprobs = logprobs
        self.sent = 0  # generated tokens already delivered
        self.compiling: asyncio.Task | None = None  # its grammar compiling, before it joins the batch
        # Prompt tokens found in the prefix cache: 0 until the cache says otherwise; None once reported.
        self.cached: int | None = 0
        self.salt = salt  # its prefix cache salt: it reuses only blocks computed for this salt (prefix.py)


class _PrefixMatches:
    """Stands in for the paged cache's `search_prefix_match` (transformers 5.23, cache.py), which the manager's
    scheduler calls on its thread when a waiting request is first scheduled and which returns how many of its
    prompt tokens were found in shared blocks: the count is kept on the request's `_Live` (so nothing outlives
    the request) for its first delta to carry as `cached_tokens`, and the blocks are counted for the stats. The
    search sees only the blocks the request's cache salt may reuse (prefix.py)."""

    def __init__(self, search, live: dict[str, _Live], tokens_per_block: int, blocks: int):
        self._search = search
        self._live = live
        self._tokens_per_block = tokens_per_block
        self._salted = SaltedPrefixes(tokens_per_block, capacity=4 * blocks)
        self.blocks = 0  # shared blocks found since the model was loaded

    def __call__(self, request_id: str, prompt_ids: list[int]) -> int:
        live = self._live.get(request_id)
        visible = self._salted.visible(live.salt if live is not None else "", prompt_ids)
        matched = self._search(request_id, visible)
        self.blocks += matched // self._tokens_per_block
        if live is not None and live.cached is not None:
            live.cached = matched
        return matched


class HfBackend:
    def __init__(self, settings: BackendSettings):
        self._settings = settings
        self._manifest = settings.manifest
        self._eos = frozenset(self._manifest.tokenizer.eos_token_ids)
        self._manager = None
        self._outputs: EngineOutputs | None = None
        self._live: dict[str, _Live] = {}
        self._logprobs = None  # hf_sampling.LogprobRecords of the manager's processors
        self._grammars = None  # structured.grammar.matcher.GrammarCache, made with the first constrained request
        self._grammar_lock = threading.Lock()
        self._dead = False
        self._kv_blocks = 0
        self._prefix: _PrefixMatches | None = None

    async def start(self, outputs: EngineOutputs) -> LoadReport:
        device = await asyncio.to_thread(self._load)
        warming = RequestStreams(self)
        self._outputs = warming
        self._manager.output_router = _StepRouter(asyncio.get_running_loop(), self._on_outputs)
        self._manager.start()
        await warm_up(warming, self._manifest.tokenizer.pad_token_id, SamplingParams())
        cache = self._manager.batch_processor.cache  # made on the generation thread before the warm-up ran
        self._prefix = _PrefixMatches(cache.search_prefix_match, self._live, self._manifest.kv_cache.tokens_per_block,
                                      self._kv_blocks)
        cache.search_prefix_match = self._prefix
        self._outputs = outputs
        # On the CPU a closed model's tensors go back to the allocator; on a GPU the CUDA context stays.
        return LoadReport(device=device, reusable=device == "cpu")

    def _load(self) -> str:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        from orchestrator.backends.hf.sampling import sampling_processors

        transformers.logging.set_verbosity_warning()
        transformers.logging.disable_progress_bar()
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)

        settings, manifest = self._settings, self._manifest
        options: HfOptions = settings.options
        if options.threads:
            torch.set_num_threads(options.threads)
        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # On CUDA, SDPA without cuDNN's attention: PyTorch 2.11 picks it for decode on Hopper, where it spent ~2 ms of
        # CPU per layer per step, likely a new plan for each new KV length (`make gpu-check` on an H100;
        # docs/benchmarking.md).
        torch.backends.cuda.enable_cudnn_sdp(not device.startswith("cuda"))
        # Paged SDPA: under the continuous batching manager the KV cache is paged; transformers 5.23 spells it
        # plain "sdpa" ("paged|sdpa" is deprecated and reduced to "sdpa" with a warning).
        model = AutoModelForCausalLM.from_pretrained(
            settings.engine_dir, dtype=getattr(torch, manifest.dtype), attn_implementation="sdpa"
        ).to(device)
        kv = manifest.kv_cache
        self._kv_blocks = max(1, settings.kv_cache_bytes // (kv.bytes_per_token * kv.tokens_per_block))
        generation = GenerationConfig(
            do_sample=False,  # the manager takes the argmax; hf_sampling draws sampled requests' tokens
            eos_token_id=list(manifest.tokenizer.eos_token_ids),
            pad_token_id=manifest.tokenizer.pad_token_id,
        )
        batching = ContinuousBatchingConfig(
            page_size=manifest.kv_cache.tokens_per_block,
            num_blocks=self._kv_blocks,
            max_batch_tokens=manifest.limits.max_num_tokens,
            max_requests_per_batch=manifest.limits.max_batch_size,
            allow_block_sharing=True,  # prefix caching
            use_cuda_graph=False,  # hf_sampling decides per step, on the host, which processors run
            use_async_batching=False,  # hf_sampling reads each request's tokens so far when preparing a step
            scheduler_type="fifo",
        )
        self._manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        self._manager.logit_processor = sampling_processors()
        self._logprobs = self._manager.logit_processor.logits_processor[-1].logprobs
        return str(model.device)

    def submit(self, request: EngineRequest) -> None:
        if self._dead or not self._manager.is_running():
            self._die("the generation loop is not running")
            raise EngineDead("the hf engine's generation loop has stopped")
        eos = frozenset(request.stop_token_ids) | (frozenset() if request.ignore_eos else self._eos)
        self._live[request.id] = _Live(eos, request.logprobs, request.cache_salt)
        if request.logprobs:
            self._logprobs.open(request.id)
        if request.guide is None:
            self._add(request, eos)
        else:  # its grammar compiles off the event loop (cached after the first time), then it joins the batch
            live = self._live[request.id]
            live.compiling = asyncio.get_running_loop().create_task(self._add_guided(request, eos, live))

    async def _add_guided(self, request: EngineRequest, eos: frozenset[int], live: _Live) -> None:
        try:
            state = await asyncio.to_thread(self._grammar_state, request.guide)
        except Exception as exc:
            if self._forget(request.id) is not None:
                error = EngineError(f"the request's grammar did not compile in the engine: {exc}")
                self._outputs.step([TokenDelta(request.id, finish=FinishReason.ERROR, error=error)])
            return
        if self._live.get(request.id) is live:  # not cancelled meanwhile
            live.compiling = None
            try:
                self._add(request, eos, state)
            except EngineDead as exc:
                self._outputs.step([TokenDelta(request.id, finish=FinishReason.ERROR, error=exc)])

    def _grammar_state(self, guide):
        """A new grammar state for `guide` (on a worker thread: the first compile of a grammar takes a while)."""
        from orchestrator.structured.grammar.matcher import GrammarCache, GuidedBatchMasker
        from orchestrator.structured.vocabulary import load_vocabulary

        with self._grammar_lock:
            if self._grammars is None:
                vocabulary = load_vocabulary(self._settings.engine_dir, stop_token_ids=tuple(sorted(self._eos)))
                self._grammars = GrammarCache(vocabulary)
                self._manager.logit_processor.logits_processor[0].masker = GuidedBatchMasker(vocabulary.size)
        return self._grammars.new_state(guide)

    def _add(self, request: EngineRequest, eos: frozenset[int], guide_state=None) -> None:
        from orchestrator.backends.hf.sampling import processor_kwargs

        accepted = self._manager.add_request(list(request.prompt_ids), request_id=request.id,
                                             max_new_tokens=request.max_new_tokens, streaming=True,
                                             eos_token_id=sorted(eos) or -1,
                                             **processor_kwargs(request, eos, guide_state))
        if accepted is None:
            self._forget(request.id)
            self._die("the generation loop refused a request")
            raise EngineDead("the hf engine's generation loop has stopped")

    def cancel(self, request_id: str) -> None:
        """The manager frees a cancelled request at its next step and says nothing more of it: its final delta
        is delivered here, on the next turn of the event loop."""
        if self._forget(request_id) is None:
            return
        self._manager.cancel_request(request_id)
        outputs = self._outputs
        asyncio.get_running_loop().call_soon(outputs.step, [TokenDelta(request_id, finish=FinishReason.CANCELLED)])

    def _on_outputs(self, outputs: list) -> None:
        """On the event loop: one engine step's outputs, every request's, together."""
        from transformers.generation.continuous_batching.requests import RequestStatus

        deltas = []
        for output in outputs:
            rid = output.request_id
            live = self._live.get(rid)
            if live is None:
                continue  # cancelled: its final delta has been delivered already
            tokens = output.generated_tokens
            new, live.sent = tokens[live.sent :], len(tokens)
            delta = TokenDelta(rid, new)
            if live.logprobs:
                records = self._logprobs.take(rid, len(new))
                delta.logprobs = [logprob for logprob, _ in records]
                delta.top_logprobs = [alternatives for _, alternatives in records]
            if output.status == RequestStatus.FAILED:
                self._forget(rid)
                if not self._manager.is_running():  # the loop itself died, not just this request
                    self._die(f"the hf engine's generation loop stopped: {output.error}")
                    return
                delta.finish, delta.error = FinishReason.ERROR, EngineError(f"the hf engine failed this request: {output.error}")
                delta.logprobs = delta.top_logprobs = None
            elif output.is_finished():
                self._forget(rid)
                delta.finish = FinishReason.LENGTH
                if new and new[-1] in live.eos:  # the end token ends the text; it is not part of it
                    delta.finish = FinishReason.STOP
                    delta.keep(len(new) - 1)
            elif not new:
                continue
            delta.cached_tokens, live.cached = live.cached, None  # once, on the first delta sent
            deltas.append(delta)
        if deltas:
            self._outputs.step(deltas)

    def _forget(self, request_id: str) -> _Live | None:
        if self._logprobs is not None:
            self._logprobs.close(request_id)
        return self._live.pop(request_id, None)

    def _die(self, reason: str) -> None:
        if not self._dead:
            self._dead = True
            self._live.clear()
            self._outputs.dead(reason)

    def stats(self) -> BackendStats:
        manager = self._manager
        processor = manager.batch_processor if manager else None
        if processor is None:
            return BackendStats(0, 0, self._kv_blocks, self._kv_blocks, 0, self._manifest.kv_cache.tokens_per_block, 0)
        scheduler, cache = processor.scheduler, processor.cache
        free = round(cache.num_blocks * cache.compute_free_capacity(relative=True))
        return BackendStats(running=len(scheduler.active_requests),
                            waiting=len(scheduler.waiting_requests) + manager.input_queue.qsize(),
                            kv_blocks_total=cache.num_blocks, kv_blocks_free=free,
                            kv_blocks_used=cache.num_blocks - free,
                            tokens_per_block=self._manifest.kv_cache.tokens_per_block,
                            iterations=getattr(manager, "current_batch", 0),
                            kv_blocks_reused=self._prefix.blocks if self._prefix else 0)

    async def close(self) -> None:
        if self._manager is not None and self._manager.is_running():
            await asyncio.to_thread(self._manager.stop, block=True, timeout=STOP_TIMEOUT_S)
