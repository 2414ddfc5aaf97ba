"""The backend driven in this process, with no HTTP, IPC or worker: the same-run baseline for what the
serving path costs (`python -m bench.baselines --in-process`).

Everything the benchmarks know about the backend protocol is in this module: `open_engine` starts a backend
with an `EngineOutputs` of our own (the backend calls its `step` once per engine step with every request's
new tokens), `engine_request` builds a request, and `run_request` submits one and waits for its end.
`InProcessSender` sends `inferno bench`'s requests that way, and `in_process_baseline` is the series.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.backends import create_backend
from orchestrator.backends.options import options_for
from orchestrator.backends.protocol import Backend, BackendSettings
from orchestrator.bench.options import BenchOptions
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.run import Baseline, Show, Workload
from orchestrator.bench.senders import RequestShape
from orchestrator.bench.series import CpuProbe, run_levels, warm_up
from orchestrator.bench.workload import RequestSpec
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams, TokenDelta
from orchestrator.errors import InfernoError
from orchestrator.text.prompt import PromptEncoder

OnTokens = Callable[[int, float], None]  # (new tokens, time.perf_counter() of the step that brought them)


@dataclass
class StepRecorder:
    """The backend's EngineOutputs: per step one timestamp, then each live request's token count."""

    live: dict[str, tuple[OnTokens, asyncio.Future]] = field(default_factory=dict)
    dead_reason: str | None = None

    def step(self, deltas: list[TokenDelta]) -> None:
        now = time.perf_counter()
        for delta in deltas:
            entry = self.live.get(delta.request_id)
            if entry is None:
                continue
            on_tokens, done = entry
            if delta.token_ids:
                on_tokens(len(delta.token_ids), now)
            if delta.finish is not None:
                del self.live[delta.request_id]
                done.set_result(None if delta.error is None else str(delta.error))

    def dead(self, reason: str) -> None:
        self.dead_reason = reason
        for _, done in self.live.values():
            done.set_result(f"the engine stopped: {reason}")
        self.live.clear()


@dataclass
class InProcessEngine:
    backend: Backend
    outputs: StepRecorder


@asynccontextmanager
async def open_engine(engine_dir: Path, threads: int | None = None) -> AsyncIterator[InProcessEngine]:
    """The backend the engine folder's manifest names, started with its default KV cache budget (and, for hf
    and llamacpp engines, `threads` CPU threads, as the server's --worker.threads gives them)."""
    manifest = load_manifest(engine_dir)
    options = options_for(manifest.backend, {"threads": threads})
    settings = BackendSettings(engine_dir, manifest, manifest.kv_cache.default_budget_bytes, options)
    backend, outputs = create_backend(settings), StepRecorder()
    await backend.start(outputs)
    try:
        yield InProcessEngine(backend, outputs)
    finally:
        await backend.close()


def engine_request(request_id: str, prompt_ids: list[int], max_tokens: int, temperature: float, ignore_eos: bool) -> EngineRequest:
    return EngineRequest(
        id=request_id, prompt_ids=tuple(prompt_ids), max_new_tokens=max_tokens,
        sampling=SamplingParams(temperature=temperature), ignore_eos=ignore_eos,
    )


async def run_request(engine: InProcessEngine, request: EngineRequest, on_tokens: OnTokens) -> str | None:
    """Submit one request and wait for its end; `on_tokens` is called at each step that gave it tokens.
    Returns None, or why it failed."""
    if engine.outputs.dead_reason is not None:
        return f"the engine stopped: {engine.outputs.dead_reason}"
    done = asyncio.get_running_loop().create_future()
    engine.outputs.live[request.id] = (on_tokens, done)
    try:
        engine.backend.submit(request)
    except InfernoError as exc:
        del engine.outputs.live[request.id]
        return f"refused by the backend: {exc}"
    return await done


class InProcessSender:
    """Drives engines of this process with the same requests (token ids from the same prompts)."""

    def __init__(self, engines: dict[str, InProcessEngine], encoders: dict, shape: RequestShape):
        self.shape = shape
        self._engines = engines
        self._encoders = encoders
        self._ids = itertools.count()

    def prepare(self, spec: RequestSpec, prompt: str) -> tuple[str, EngineRequest]:
        encoder = self._encoders[spec.model]
        if self.shape.chat:
            ids = encoder.encode_chat([{"role": "user", "content": prompt}])
        else:
            ids = encoder.encode_text(prompt)
        request = engine_request(f"bench-{next(self._ids)}", ids, spec.osl, self.shape.temperature, self.shape.ignore_eos)
        return spec.model, request

    async def send(self, prepared: tuple[str, EngineRequest]) -> RequestTiming:
        model, request = prepared
        record = RequestTiming(model, time.perf_counter(), output_tokens=0, prompt_tokens=len(request.prompt_ids))

        def on_tokens(count: int, now: float) -> None:
            record.token_times.append(now)
            record.output_tokens += count
            record.events += 1

        record.error = await run_request(self._engines[model], request, on_tokens)
        record.end = time.perf_counter()
        return record


async def _in_process_series(work: Workload, options: BenchOptions, _workdir: Path, show: Show) -> list[dict]:
    """Each model's backend started in this process (after the server has stopped), driven with the run's
    levels and prompts; the CPU measured is this process's."""
    shape = RequestShape(options.chat, options.ignore_eos, options.temperature)
    async with AsyncExitStack() as stack:
        engines = {m: await stack.enter_async_context(open_engine(options.engines_dir / m, options.engine_threads)) for m in work.models}
        encoders = {m: PromptEncoder(options.engines_dir / m) for m in work.models}
        sender = InProcessSender(engines, encoders, shape)
        await warm_up(sender, work.warmup, work.warmup_prompts)
        pid = os.getpid()
        cpu = CpuProbe(pid, lambda: {pid: "in-process"}, options.exclude_threads, work.floor_us)
        return await run_levels("in-process", sender, work.levels, work.prompts, options, cpu, show)


def in_process_baseline() -> Baseline:
    """The `in-process` series of a run whose target is an Inferno server the bench started (--engines-dir)."""
    return Baseline("in-process", _in_process_series)
