"""The backend driven in this process, with no HTTP, IPC or worker: the same-run baseline for what the
serving path costs.

Everything the benchmark knows about the backend protocol is in this module: `open_engine` starts a backend
with an `EngineOutputs` of our own (the backend calls its `step` once per engine step with every request's
new tokens), `engine_request` builds a request, and `run_request` submits one and waits for its end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.backends import create_backend
from orchestrator.backends.options import options_for
from orchestrator.backends.protocol import Backend, BackendSettings
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams, TokenDelta
from orchestrator.errors import InfernoError

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
