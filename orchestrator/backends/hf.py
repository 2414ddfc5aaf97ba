"""The `hf` backend: transformers' continuous batching manager with paged attention, on PyTorch.

Portable (CPU, CUDA, anything torch supports) and the embedded default. The manager runs its own
generation thread and delivers every step's outputs in one `call_soon_threadsafe` onto this worker's
event loop; each request's stream picks its new tokens from there.
"""

from __future__ import annotations

import asyncio
import logging

from orchestrator.backends.protocol import BackendSettings, BackendStats, LoadReport
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import BackendUnavailable, EngineDead

log = logging.getLogger(__name__)

_CANCELLED = object()  # put on a request's queue by cancel(): the manager sends nothing for cancelled requests
WARMUP_ID = "warmup"
STOP_TIMEOUT_S = 10.0


def preload() -> None:
    """Import what a load needs (torch, transformers, the Llama-family model code): most of a cold start."""
    import torch  # noqa: F401
    import transformers
    from transformers.generation.continuous_batching import continuous_api  # noqa: F401

    from orchestrator.backends import hf_sampling  # noqa: F401

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


class HfBackend:
    def __init__(self, settings: BackendSettings):
        self._settings = settings
        self._manifest = settings.manifest
        self._eos = frozenset(self._manifest.tokenizer.eos_token_ids)
        self._manager = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._kv_blocks = 0

    async def start(self) -> LoadReport:
        device = await asyncio.to_thread(self._load)
        self._manager.start()
        await self._warm_up()
        return LoadReport(
            device=device,
            kv_cache_bytes=self._kv_blocks * self._block_bytes(),
            kv_blocks=self._kv_blocks,
            tokens_per_block=self._manifest.kv_cache.tokens_per_block,
            max_batch_size=self._manifest.limits.max_batch_size,
        )

    def _block_bytes(self) -> int:
        kv = self._manifest.kv_cache
        return kv.bytes_per_token * kv.tokens_per_block

    def _load(self) -> str:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        from orchestrator.backends.hf_sampling import sampling_processors

        transformers.logging.set_verbosity_warning()
        transformers.logging.disable_progress_bar()
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)

        settings, manifest = self._settings, self._manifest
        if settings.threads:
            torch.set_num_threads(settings.threads)
        device = settings.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # Paged SDPA: under the continuous batching manager the KV cache is paged; transformers 5.23 spells it
        # plain "sdpa" ("paged|sdpa" is deprecated and reduced to "sdpa" with a warning).
        model = AutoModelForCausalLM.from_pretrained(
            settings.engine_dir, dtype=getattr(torch, manifest.dtype), attn_implementation="sdpa"
        ).to(device)
        self._kv_blocks = max(1, settings.kv_cache_bytes // self._block_bytes())
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
            scheduler_type="fifo",
        )
        self._manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        self._manager.logit_processor = sampling_processors()
        return str(model.device)

    async def _warm_up(self) -> None:
        """One short request through the whole path, so the first user request does not pay for it."""
        prompt = EngineRequest(id=WARMUP_ID, prompt_ids=(self._manifest.tokenizer.pad_token_id,) * 8, max_new_tokens=2)
        async for _ in self.submit(prompt):
            pass

    async def submit(self, request: EngineRequest):
        from orchestrator.backends.hf_sampling import processor_kwargs

        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request.id] = queue
        self._manager.register_result_handler(request.id, queue.put_nowait)
        accepted = self._manager.add_request(
            list(request.prompt_ids),
            request_id=request.id,
            max_new_tokens=request.max_new_tokens,
            streaming=True,
            eos_token_id=list(self._eos),
            **processor_kwargs(request.sampling),
        )
        try:
            if accepted is None:
                raise EngineDead("the hf engine's generation loop has stopped")
            async for delta in self._deltas(queue):
                yield delta
        finally:
            self._forget(request.id)

    async def _deltas(self, queue: asyncio.Queue):
        from transformers.generation.continuous_batching.requests import RequestStatus

        sent = 0
        while True:
            output = await queue.get()
            if output is _CANCELLED:
                yield TokenDelta(finish=FinishReason.CANCELLED)
                return
            tokens = output.generated_tokens
            new, sent = tokens[sent:], len(tokens)
            if output.status == RequestStatus.FAILED:
                if not self._manager.is_running():  # the loop itself died, not just this request
                    raise EngineDead(f"the hf engine's generation loop stopped: {output.error}")
                yield TokenDelta(new, FinishReason.ERROR, error=output.error or "the hf engine failed")
                return
            if output.is_finished():
                if new and new[-1] in self._eos:
                    yield TokenDelta(new[:-1], FinishReason.STOP)
                else:
                    yield TokenDelta(new, FinishReason.LENGTH)
                return
            if new:
                yield TokenDelta(new)

    def cancel(self, request_id: str) -> None:
        queue = self._streams.get(request_id)
        if queue is None:
            return
        self._manager.cancel_request(request_id)  # freed at the start of the next engine step
        queue.put_nowait(_CANCELLED)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        router = self._manager.output_router  # a cancelled request's handler is never cleaned up otherwise
        with router._lock:
            router.result_handlers.pop(request_id, None)

    def stats(self) -> BackendStats:
        manager = self._manager
        processor = manager.batch_processor if manager else None
        if processor is None:
            return BackendStats(0, 0, self._kv_blocks, self._kv_blocks, 0, self._manifest.kv_cache.tokens_per_block, 0)
        scheduler, cache = processor.scheduler, processor.cache
        free = round(cache.num_blocks * cache.compute_free_capacity(relative=True))
        return BackendStats(
            running=len(scheduler.active_requests),
            waiting=len(scheduler.waiting_requests) + manager.input_queue.qsize(),
            kv_blocks_total=cache.num_blocks,
            kv_blocks_free=free,
            kv_blocks_used=cache.num_blocks - free,
            tokens_per_block=self._manifest.kv_cache.tokens_per_block,
            iterations=getattr(manager, "current_batch", 0),
        )

    async def close(self) -> None:
        if self._manager is not None and self._manager.is_running():
            await asyncio.to_thread(self._manager.stop, block=True, timeout=STOP_TIMEOUT_S)
