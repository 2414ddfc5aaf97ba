"""The `hf` backend: transformers' continuous batching manager with paged attention, on PyTorch.

Portable (CPU, CUDA, anything torch supports) and the embedded default. The manager runs its own
generation thread; every step's outputs reach this worker's event loop in one `call_soon_threadsafe`, and
become one `EngineOutputs.step` call with every request's new tokens.
"""

from __future__ import annotations

import asyncio
import logging

from orchestrator.backends.protocol import (
    BackendSettings,
    BackendStats,
    EngineOutputs,
    LoadReport,
    RequestStreams,
)
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import BackendUnavailable, EngineDead, EngineError

log = logging.getLogger(__name__)

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


class _StepRouter:
    """Stands in for the manager's output router: every step's outputs reach the worker's event loop in one
    `call_soon_threadsafe`, instead of one callback per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_outputs):
        self._loop = loop
        self._on_outputs = on_outputs

    def deliver_batch(self, outputs: list) -> None:
        try:
            self._loop.call_soon_threadsafe(self._on_outputs, outputs)
        except RuntimeError:  # the worker's loop is closed: it is exiting
            pass

    def deliver(self, output) -> None:
        self.deliver_batch([output])

    def fail_and_deliver(self, state, error: Exception) -> None:
        from transformers.generation.continuous_batching.requests import RequestStatus

        state.status = RequestStatus.FAILED
        state.error = str(error)
        self.deliver(state.to_generation_output())


class _Live:
    """What the backend keeps per running request."""

    __slots__ = ("eos", "sent")

    def __init__(self, eos: frozenset[int]):
        self.eos = eos  # the tokens that end this request (end tokens unless ignored, plus its stop tokens)
        self.sent = 0  # generated tokens already delivered


class HfBackend:
    def __init__(self, settings: BackendSettings):
        self._settings = settings
        self._manifest = settings.manifest
        self._eos = frozenset(self._manifest.tokenizer.eos_token_ids)
        self._manager = None
        self._outputs: EngineOutputs | None = None
        self._live: dict[str, _Live] = {}
        self._dead = False
        self._kv_blocks = 0

    async def start(self, outputs: EngineOutputs) -> LoadReport:
        device = await asyncio.to_thread(self._load)
        warm_up = RequestStreams(self)
        self._outputs = warm_up
        self._manager.output_router = _StepRouter(asyncio.get_running_loop(), self._on_outputs)
        self._manager.start()
        await self._warm_up(warm_up)
        self._outputs = outputs
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
            use_async_batching=False,  # hf_sampling reads each request's tokens so far when preparing a step
            scheduler_type="fifo",
        )
        self._manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        self._manager.logit_processor = sampling_processors()
        return str(model.device)

    async def _warm_up(self, streams: RequestStreams) -> None:
        """One short request through the whole path, so the first user request does not pay for it."""
        prompt = EngineRequest(id=WARMUP_ID, prompt_ids=(self._manifest.tokenizer.pad_token_id,) * 8, max_new_tokens=2)
        deltas = await streams.run(prompt)
        if deltas[-1].finish is FinishReason.ERROR:
            raise EngineError(f"the engine failed its warm-up request: {deltas[-1].error}")

    def submit(self, request: EngineRequest) -> None:
        from orchestrator.backends.hf_sampling import processor_kwargs

        if self._dead or not self._manager.is_running():
            self._die("the generation loop is not running")
            raise EngineDead("the hf engine's generation loop has stopped")
        eos = frozenset(request.stop_token_ids) | (frozenset() if request.ignore_eos else self._eos)
        self._live[request.id] = _Live(eos)
        accepted = self._manager.add_request(
            list(request.prompt_ids),
            request_id=request.id,
            max_new_tokens=request.max_new_tokens,
            streaming=True,
            eos_token_id=sorted(eos) or -1,
            **processor_kwargs(request.sampling),
        )
        if accepted is None:
            del self._live[request.id]
            self._die("the generation loop refused a request")
            raise EngineDead("the hf engine's generation loop has stopped")

    def cancel(self, request_id: str) -> None:
        """The manager frees a cancelled request at its next step and says nothing more of it: its final delta
        is delivered here, on the next turn of the event loop."""
        if self._live.pop(request_id, None) is None:
            return
        self._manager.cancel_request(request_id)
        outputs = self._outputs
        asyncio.get_running_loop().call_soon(outputs.step, [TokenDelta(request_id, finish=FinishReason.CANCELLED)])

    def _on_outputs(self, outputs: list) -> None:
        """On the event loop: one engine step's outputs, every request's, together."""
        from transformers.generation.continuous_batching.requests import RequestStatus

        deltas = []
        for output in outputs:
            live = self._live.get(output.request_id)
            if live is None:
                continue  # cancelled: its final delta has been delivered already
            tokens = output.generated_tokens
            new, live.sent = tokens[live.sent :], len(tokens)
            if output.status == RequestStatus.FAILED:
                del self._live[output.request_id]
                if not self._manager.is_running():  # the loop itself died, not just this request
                    self._die(f"the hf engine's generation loop stopped: {output.error}")
                    return
                error = EngineError(f"the hf engine failed this request: {output.error}")
                deltas.append(TokenDelta(output.request_id, new, FinishReason.ERROR, error))
            elif output.is_finished():
                del self._live[output.request_id]
                if new and new[-1] in live.eos:
                    deltas.append(TokenDelta(output.request_id, new[:-1], FinishReason.STOP))
                else:
                    deltas.append(TokenDelta(output.request_id, new, FinishReason.LENGTH))
            elif new:
                deltas.append(TokenDelta(output.request_id, new))
        if deltas:
            self._outputs.step(deltas)

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
