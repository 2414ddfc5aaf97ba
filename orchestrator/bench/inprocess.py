"""The backend driven in this process, with no HTTP, IPC or worker: the same-run baseline for what the
serving path costs.

Everything the benchmark knows about the backend protocol is in the three functions below, so a change to
the protocol's output side (today an async stream of TokenDelta per request) is adapted here only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from orchestrator.backends import create_backend
from orchestrator.backends.protocol import Backend, BackendSettings
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams

_REQUEST_FIELDS = {f.name for f in dataclasses.fields(EngineRequest)}


@asynccontextmanager
async def open_backend(engine_dir: Path) -> AsyncIterator[Backend]:
    """The backend the engine folder's manifest names, started with its default KV cache budget."""
    manifest = load_manifest(engine_dir)
    settings = BackendSettings(
        engine_dir=engine_dir, manifest=manifest, kv_cache_bytes=manifest.kv_cache.default_budget_bytes
    )
    backend = create_backend(settings)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def engine_request(
    request_id: str, prompt_ids: list[int], max_tokens: int, temperature: float, ignore_eos: bool
) -> tuple[EngineRequest, bool]:
    """The engine request, and whether `ignore_eos` could be honoured (EngineRequest has no such field
    until the engines accept it; then outputs may end early at an end token)."""
    extra = {"ignore_eos": True} if ignore_eos and "ignore_eos" in _REQUEST_FIELDS else {}
    request = EngineRequest(
        id=request_id, prompt_ids=tuple(prompt_ids), max_new_tokens=max_tokens,
        sampling=SamplingParams(temperature=temperature), **extra,
    )
    return request, bool(extra) or not ignore_eos


async def stream_request(backend: Backend, request: EngineRequest, on_tokens: Callable[[int], None]) -> str | None:
    """Run one request to its end, calling `on_tokens(n)` once per engine step that gave it n new tokens.
    Returns None, or the engine's error message."""
    async for delta in backend.submit(request):
        if delta.token_ids:
            on_tokens(len(delta.token_ids))
        if delta.finish is FinishReason.ERROR:
            return delta.error or "the engine failed the request"
    return None
