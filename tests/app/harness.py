"""The real app in-process (aiohttp's TestServer on a loopback port), serving the real SmolLM2 engine's
tokenizer and chat template, with workers that live in the event loop (tests/fakes/workers.py): the test
says what the engine produces, step by step, and sees what the app does to the worker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp.test_utils import TestClient, TestServer

from orchestrator.access.keys import hash_key
from orchestrator.api.app import build_app, runner_options
from orchestrator.api.state import STATE, AppState
from orchestrator.config import load_config
from orchestrator.engine.catalogue import Catalogue, discover
from orchestrator.ipc.messages import TextDelta
from orchestrator.scheduler import ModelSnapshot, Scheduler
from tests.fakes.workers import FakeWorkers


@dataclass
class RunningApp:
    client: TestClient
    workers: FakeWorkers
    scheduler: Scheduler
    model: str
    state: AppState

    def snapshot(self) -> ModelSnapshot:
        """The model's snapshot now, as the scheduler shows it to metrics and the admin API."""
        [snapshot] = (s for s in self.scheduler.snapshot() if s.name == self.model)
        return snapshot


def one_model(default_engine: Path) -> Catalogue:
    return discover(default_engine.parent, (default_engine.name,))


@contextlib.asynccontextmanager
async def running_app(catalogue: Catalogue, *flags: str) -> AsyncIterator[RunningApp]:
    """The app over the catalogue's one model, started (its cleanup context ran) and the model loaded."""
    [engine] = catalogue.engines.values()
    config = load_config(["--engines-dir", str(engine.folder.parent), "--models", engine.name, *flags])
    workers = FakeWorkers()
    app = build_app(config, catalogue, workers)
    server = TestServer(app)
    await server.start_server(**runner_options(config))  # what the real server's runner is given, too
    async with TestClient(server) as client:
        state = app[STATE]
        await state.initial_loads
        await state.scheduler.load(engine.name)
        yield RunningApp(client, workers, state.scheduler, engine.name, state)


def sse_events(raw: bytes) -> list[dict | str]:
    """The events of a text/event-stream body, each `data: <json>` parsed; the stream must end with a
    blank line after its last event, and every event is exactly one `data:` line."""
    assert raw.endswith(b"\n\n"), raw[-40:]
    events: list[dict | str] = []
    for block in raw[:-2].split(b"\n\n"):
        assert block.startswith(b"data: ") and b"\n" not in block, block
        payload = block[len(b"data: "):]
        events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return events


def keys_file_flags(folder: Path, *names: str) -> tuple[str, str]:
    """The server flags for a keys file of plain keys `sk-<name>`, one per name, with no limits."""
    path = folder / "keys.toml"
    path.write_text("".join(f'[keys.{name}]\nkey = "{hash_key(f"sk-{name}")}"\n' for name in names))
    return "--auth.keys-file", str(path)


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def say(worker, request_id: str, text: str = "", reasoning: str | None = None, tokens: int = 1,
        finish=None, tool_calls: list | None = None) -> None:
    """The engine's output of one step for a request, as its worker would send it (reasoning, tool calls)."""
    worker.sinks[request_id](TextDelta(request_id, text, tokens, finish, reasoning=reasoning,
                                       tool_calls=tool_calls).to_wire())


def named_events(raw: bytes) -> list[dict]:
    """The data of each event of a named-event stream (the agent APIs'); every `event:` name agrees with its
    data's `type`, and every block is exactly one `event:` and one `data:` line."""
    payloads = []
    for block in raw.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        payload = orjson.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        payloads.append(payload)
    return payloads
