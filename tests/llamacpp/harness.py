"""The llamacpp backend driven in-process on its own event loop, as a worker drives it (RequestStreams)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tokenizers import Tokenizer

from orchestrator.backends.llamacpp.backend import create
from orchestrator.backends.options import LlamaCppOptions
from orchestrator.backends.protocol import BackendSettings, RequestStreams
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, TokenDelta
from tests.conftest import copy_engine


def engine_variant(source: Path, engines: Path, name: str, **limits) -> Path:
    """A copy of the engine (weights hard-linked) whose manifest has other limits, e.g. fewer sequence slots."""
    folder = copy_engine(source, engines, name)
    manifest = json.loads((folder / "engine.json").read_text())
    manifest["limits"].update(limits)
    (folder / "engine.json").write_text(json.dumps(manifest))
    return folder


class Engine:
    def __init__(self, folder: Path, kv_cache_bytes: int | None = None, options: LlamaCppOptions | None = None):
        manifest = load_manifest(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.eos = manifest.tokenizer.eos_token_ids
        self.loop = asyncio.new_event_loop()
        budget = kv_cache_bytes or manifest.kv_cache.default_budget_bytes
        self.backend = create(BackendSettings(engine_dir=folder, manifest=manifest, kv_cache_bytes=budget,
                                              options=options))
        self.streams = RequestStreams(self.backend)
        self.report = self.loop.run_until_complete(self.backend.start(self.streams))

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def run(self, *requests: EngineRequest) -> list[list[TokenDelta]]:
        """Every delta of each request, the requests running together."""

        async def together():
            return await asyncio.gather(*(self.streams.run(request) for request in requests))

        return self.loop.run_until_complete(together())

    def close(self) -> None:
        self.loop.run_until_complete(self.backend.close())
        self.loop.close()


def tokens(deltas: list[TokenDelta]) -> list[int]:
    return [t for delta in deltas for t in delta.token_ids]
