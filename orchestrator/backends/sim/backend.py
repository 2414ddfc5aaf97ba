"""The `sim` backend: a simulated GPU engine (orchestrator/backends/sim/) behind the backend protocol.

It behaves like TensorRT-LLM serving the model on the GPU it was built for, at that GPU's rates (divided by
the engine's speed-up), with no GPU: the orchestrator can be measured at GPU rates, placement and swaps
exercised on a simulated device, and capacity planned. See docs/simulation.md.

One thread, named `sim-engine` (also at the OS level, so a benchmark can find and subtract its CPU), runs
the engine: per step it takes the requests and cancels that came in, lets the engine admit, schedule and
advance (orchestrator.backends.sim.engine), then sleeps to an absolute deadline, t0 + step_ms / speedup, so its own
bookkeeping counts against the step and sleep overshoot does not accumulate. The step's deltas then reach the
worker's event loop in one `call_soon_threadsafe` and one `outputs.step` call. An idle engine waits on a
condition; nothing spins and nothing polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import sys
import threading
import time
from dataclasses import replace

from tokenizers import Tokenizer

from orchestrator.backends.protocol import BackendSettings, BackendStats, EngineOutputs, LoadReport, hand_over
from orchestrator.backends.sim.corpus import corpus_tokens
from orchestrator.backends.sim.engine import SimEngine
from orchestrator.backends.sim.memory import device_bytes, kv_token_capacity
from orchestrator.backends.sim.spec import SimSpec, load_sim_spec
from orchestrator.engine.gpus import find_gpu
from orchestrator.engine.request import EngineRequest, TokenDelta
from orchestrator.errors import EngineDead, ModelUnavailable

log = logging.getLogger(__name__)

THREAD_NAME = "sim-engine"
MAX_LAG_S = 0.05  # a loop this far behind its deadlines (a stall) starts afresh instead of catching up


def preload() -> None:
    """Nothing heavy to import: the simulator is pure Python over `tokenizers`."""


def create(settings: BackendSettings) -> SimBackend:
    """The backend for a sim engine folder; refuses a capacity policy it does not simulate."""
    policy = settings.options.capacity_policy
    if policy != "guaranteed_no_evict":
        raise ModelUnavailable(
            f"the sim backend simulates TensorRT-LLM's guaranteed_no_evict capacity policy only, and the server "
            f"asks for {policy} (--worker.capacity-policy)"
        )
    return SimBackend(settings, load_sim_spec(settings.engine_dir))


def name_os_thread(name: str) -> None:
    """Give the calling thread its name at the OS level too (Linux: /proc/<pid>/task/<tid>/comm)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class SimBackend:
    def __init__(self, settings: BackendSettings, spec: SimSpec):
        manifest = settings.manifest
        self._settings = settings
        self._spec = spec
        self._speedup = manifest.simulation.speedup
        kv = manifest.kv_cache
        self.kv_tokens = spec.kv_tokens or kv_token_capacity(settings.kv_cache_bytes, kv.bytes_per_token, kv.tokens_per_block)
        if self.kv_tokens < kv.tokens_per_block:
            raise ValueError(
                f"a KV cache budget of {settings.kv_cache_bytes} bytes holds no whole block of "
                f"{kv.tokens_per_block} tokens ({kv.bytes_per_token} bytes per token)"
            )
        self._engine: SimEngine | None = None
        self._outputs: EngineOutputs | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition()
        self._inbox: list[tuple[bool, object]] = []  # (is a submit, the request or the id to cancel)
        self._queued = 0  # submits in the inbox, for stats()
        self._stopping = False
        self._asleep = threading.Lock()  # held until close(): the engine thread sleeps by waiting for it
        self._asleep.acquire()
        self._thread: threading.Thread | None = None
        self._stats: BackendStats | None = None
        self._failure: str | None = None

    async def start(self, outputs: EngineOutputs) -> LoadReport:
        """Tokenize the corpus, size the KV cache, take the simulated load time, start the engine thread."""
        settings, manifest = self._settings, self._settings.manifest
        tokenizer = Tokenizer.from_file(str(settings.engine_dir / "tokenizer.json"))
        corpus = corpus_tokens(tokenizer, frozenset(manifest.tokenizer.eos_token_ids))
        kv = manifest.kv_cache
        blocks = self.kv_tokens // kv.tokens_per_block
        host_blocks, onboard_ms = self.host_tier()
        self._engine = SimEngine(
            self._spec.step, manifest.limits, kv.tokens_per_block, blocks, corpus, self._spec.natural_length,
            host_blocks=host_blocks, onboard_ms_per_block=onboard_ms,
            retain_system_prompt=settings.options.retain_system_prompt,
        )
        self._stats = self._engine.stats()
        facts = manifest.simulation
        load_s = self._spec.load_seconds(manifest.weights_bytes, find_gpu(facts.gpu).host_link_bytes_s,
                                         facts.gpu_count, settings.weights_kept)
        await asyncio.sleep(load_s / self._speedup)
        self._outputs, self._loop = outputs, asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        log.info(
            "simulated %s x%d (%s, speed-up %g): loaded in %.3g s (weights %s), %d KV tokens in %d blocks, "
            "%d more blocks in host RAM", facts.gpu, facts.gpu_count, facts.precision, self._speedup, load_s,
            "kept in host RAM" if settings.weights_kept else "from disk", self.kv_tokens, blocks, host_blocks,
        )
        return LoadReport(
            device=f"sim:{facts.gpu}",
            reusable=True,  # nothing real is held: closing returns the simulated GPU's memory
            device_bytes=device_bytes(
                manifest.weights_bytes, self.kv_tokens, kv.bytes_per_token, self._spec.runtime_overhead_bytes
            ),
        )

    def host_tier(self) -> tuple[int, float]:
        """The host KV tier the model's prompt_cache_bytes buys, in blocks, and one block's copy back to the GPU in
        simulated ms (the block's bytes over the simulated GPU's host link; spread over its GPUs' links with TP)."""
        manifest = self._settings.manifest
        kv, facts = manifest.kv_cache, manifest.simulation
        block_bytes = kv.bytes_per_token * kv.tokens_per_block
        host_blocks = (self._settings.options.prompt_cache_bytes or 0) // block_bytes
        link = find_gpu(facts.gpu).host_link_bytes_s * facts.gpu_count
        return host_blocks, block_bytes / link * 1e3

    def submit(self, request: EngineRequest) -> None:
        if self._failure is not None:
            raise EngineDead(f"the simulated engine stopped: {self._failure}")
        self._engine.check(request)
        with self._cond:
            self._inbox.append((True, request))
            self._queued += 1
            self._cond.notify()

    def cancel(self, request_id: str) -> None:
        with self._cond:
            self._inbox.append((False, request_id))
            self._cond.notify()

    def stats(self) -> BackendStats:
        """The state the engine thread published after its latest step, plus the submits it has not taken yet."""
        stats = self._stats
        if stats is None:  # not started
            kv = self._settings.manifest.kv_cache
            blocks = self.kv_tokens // kv.tokens_per_block
            return BackendStats(0, self._queued, blocks, blocks, 0, kv.tokens_per_block, 0)
        return replace(stats, waiting=stats.waiting + self._queued)

    async def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._asleep.locked():
            self._asleep.release()  # ends a sleep at once
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    # -- the engine thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread(THREAD_NAME)
        try:
            self._steps()
        except Exception as exc:  # a bug in the simulator: the engine is dead, as a real one would be
            log.exception("the simulated engine failed")
            hand_over(self._loop, self._die, f"{type(exc).__name__}: {exc}")

    def _steps(self) -> None:
        engine, speedup = self._engine, self._speedup
        deadline: float | None = None  # when the previous step ends; None after a step that ran nothing
        while True:
            inbox = self._take_inbox(wait=deadline is None)
            if inbox is None:
                return
            now = time.perf_counter()
            start = now if deadline is None or now - deadline > MAX_LAG_S else deadline
            for is_submit, item in inbox:
                if is_submit:
                    engine.add(item)
                else:
                    engine.cancel(item)
            result = engine.step()
            deadline = None
            if result.scheduled:
                self._stats = engine.stats(result.step_ms / speedup)
                deadline = start + result.step_ms / speedup / 1e3
                remaining = deadline - time.perf_counter()
                if remaining > 0 and self._asleep.acquire(timeout=remaining):
                    return  # closing
            else:
                self._stats = engine.stats(self._stats.iteration_latency_ms)
            if result.deltas and not hand_over(self._loop, self._deliver, result.deltas):
                return

    def _take_inbox(self, wait: bool) -> list | None:
        """What came in since the last step; with `wait` (the last step ran nothing), waits for something first.
        None: closing."""
        if not (wait or self._inbox or self._stopping):
            return []  # nothing came in: no need for the lock
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: self._inbox or self._stopping)
            if self._stopping:
                return None
            inbox, self._inbox, self._queued = self._inbox, [], 0
            return inbox


    def _deliver(self, deltas: list[TokenDelta]) -> None:
        """On the event loop: one step's deltas, every request's, in one call."""
        if self._failure is None:
            self._outputs.step(deltas)

    def _die(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            self._outputs.dead(f"the simulated engine stopped: {reason}")
