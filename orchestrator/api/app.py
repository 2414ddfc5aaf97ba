"""The aiohttp application: routes, the error middleware, and the start/stop of the scheduler.

The scheduler starts with the app (its initial loads run in a task, so the server listens while models
load) and stops in the app's cleanup: on shutdown it drains first, then stops every worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchestrator.api import admin
from orchestrator.api.auth import auth_middleware
from orchestrator.api.generation import serve_generation
from orchestrator.api.http import error_response, json_response, parse
from orchestrator.api.openapi import openapi
from orchestrator.api.responses import Format
from orchestrator.api.state import STATE, AppState
from orchestrator.api.tokenize import detokenize, tokenize
from orchestrator.api.wire import ChatCompletionRequest, CompletionRequest
from orchestrator.config import ServerConfig
from orchestrator.engine.catalogue import Catalogue
from orchestrator.engine.manifest import EngineManifest
from orchestrator.errors import InfernoError, MethodNotAllowed, NotFound
from orchestrator.metrics.engine_collector import EngineCollector
from orchestrator.metrics.http_metrics import http_metrics_middleware
from orchestrator.metrics.registry import new_registry
from orchestrator.metrics.request_metrics import RequestMetrics
from orchestrator.metrics.scheduler_events import SchedulerMetrics
from orchestrator.metrics.simulation import register_simulation_info
from orchestrator.scheduler.observe import ModelSnapshot
from orchestrator.scheduler.scheduler import Scheduler
from orchestrator.structured.checker import GrammarChecker
from orchestrator.worker.handle import WorkerSource
from orchestrator.worker.pool import WorkerPool

log = logging.getLogger(__name__)

CHAT = Format("chat.completion", "chat.completion.chunk", chat=True)
TEXT = Format("text_completion", "text_completion", chat=False)


# -- routes -------------------------------------------------------------------------------------------------
async def chat_completions(http: web.Request) -> web.StreamResponse:
    return await serve_generation(http, await parse(http, ChatCompletionRequest), CHAT, "chatcmpl")


async def completions(http: web.Request) -> web.StreamResponse:
    return await serve_generation(http, await parse(http, CompletionRequest), TEXT, "cmpl")


def _model_card(model: ModelSnapshot, manifest: EngineManifest) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": int(datetime.fromisoformat(manifest.build.built_at).timestamp()),
        "owned_by": "inferno",
        "max_model_len": manifest.limits.max_seq_len,
        "backend": model.backend,
        "state": model.state,
        "simulated": manifest.simulation is not None,  # a sim engine: GPU rates without a GPU, synthetic text
        **({"simulation": manifest.simulation.model_dump()} if manifest.simulation else {}),
    }


def _model_cards(state: AppState) -> dict[str, dict]:
    engines = state.catalogue.engines
    return {m.name: _model_card(m, engines[m.name].manifest) for m in state.scheduler.snapshot()}


async def list_models(http: web.Request) -> web.Response:
    cards = _model_cards(http.app[STATE])
    return json_response({"object": "list", "data": [cards[name] for name in sorted(cards)]})


async def get_model(http: web.Request) -> web.Response:
    state = http.app[STATE]
    name = http.match_info["model"]
    state.scheduler.slot_for(name)  # 404 / 503 with the reason
    return json_response(_model_cards(state)[name])


async def health(http: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(http: web.Request) -> web.Response:
    scheduler = http.app[STATE].scheduler
    models = {model.name: model.state for model in scheduler.snapshot()}
    status = 200 if scheduler.ready else 503
    return json_response({"ready": scheduler.ready, "models": models}, status)


async def metrics(http: web.Request) -> web.Response:
    state = http.app[STATE]
    await state.engine_collector.refresh()
    return web.Response(body=generate_latest(state.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


# -- middlewares --------------------------------------------------------------------------------------------
@web.middleware
async def errors_middleware(http: web.Request, handler) -> web.StreamResponse:
    """Every error as OpenAI's JSON error, with the status from the one table (errors.py)."""
    try:
        return await handler(http)
    except InfernoError as exc:
        return error_response(exc)
    except web.HTTPNotFound:
        return error_response(NotFound(f"no such endpoint: {http.method} {http.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(MethodNotAllowed(f"{http.method} is not allowed on {http.path}"))
    except (web.HTTPException, ConnectionResetError):
        raise  # aiohttp's own answers (413 ...); a client that went away hears nothing
    except Exception as exc:
        log.exception("unexpected error on %s %s", http.method, http.path)
        if http.writer.output_size > 0:
            raise  # a stream has begun: aiohttp closes the connection
        return error_response(exc)


def build_app(config: ServerConfig, catalogue: Catalogue, workers: WorkerSource | None = None) -> web.Application:
    """The app over the catalogue's models; `workers` defaults to worker processes with a spare kept ready."""
    registry = new_registry()
    if workers is None:
        backends = tuple(sorted({e.manifest.backend for e in catalogue.engines.values()}))
        workers = WorkerPool.for_config(config, backends, cores=os.cpu_count() or 1)
    scheduler = Scheduler(config, catalogue, workers, events=SchedulerMetrics(registry, catalogue.engines))
    engine_collector = EngineCollector(scheduler)
    registry.register(engine_collector)
    register_simulation_info(registry, catalogue.engines)
    app = web.Application(
        middlewares=[http_metrics_middleware(registry), errors_middleware, auth_middleware(config.auth)],
        client_max_size=64 * 2**20,
    )
    grammar = GrammarChecker(time_limit_s=config.structured.compile_timeout_s,
                             cache_entries=config.structured.cache_entries)
    app[STATE] = AppState(config, catalogue, scheduler, registry, RequestMetrics(registry), engine_collector, grammar)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    admin.add_routes(app)
    app.on_shutdown.append(_drain_on_shutdown)
    app.cleanup_ctx.append(_scheduler_lifetime)
    return app


async def _scheduler_lifetime(app: web.Application):
    """Start the scheduler with the app (its initial loads in a task: /health answers meanwhile, /ready says
    when they are done); stop it, and every worker, when the app is cleaned up."""
    state = app[STATE]
    state.initial_loads = asyncio.create_task(state.scheduler.start(), name="initial-loads")
    yield
    state.initial_loads.cancel()
    await state.scheduler.stop(state.config.drain_timeout_s)
    await state.grammar.close()


async def _drain_on_shutdown(app: web.Application) -> None:
    """Shutdown begins: refuse new requests, turn queued ones away, stop initial loads; running ones go on."""
    state = app[STATE]
    if state.initial_loads is not None:
        state.initial_loads.cancel()
    state.scheduler.begin_drain()
