"""The aiohttp application: routes, middlewares, and the start/stop of the scheduler.

Middlewares, outermost first: the outcome (the request's record and id, made first; its final status worked out
once, then observed by the HTTP metrics and settled by the accounting: key limits, usage, audit log); errors (everything as OpenAI's JSON error); browser origins (CORS); API keys.

The scheduler starts with the app (its initial loads run in a task, so the server listens while models
load) and stops in the app's cleanup: on shutdown it drains first, then stops every worker.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchestrator.access.audit import AuditLog
from orchestrator.access.keys import load_keys, refuse_open_exposure
from orchestrator.access.limits import KeyLimiters
from orchestrator.access.usage import UsageMeter
from orchestrator.api import admin
from orchestrator.api.access import model_view, visible_models
from orchestrator.api.accounting import Accounting
from orchestrator.api.auth import auth_middleware
from orchestrator.api.body import parse
from orchestrator.api.completions_format import Format
from orchestrator.api.error_handling import errors_middleware, stamp_request_id
from orchestrator.api.generation import serve_generation
from orchestrator.api.http import json_response
from orchestrator.api.messages_api import routes as messages_api
from orchestrator.api.openapi import openapi
from orchestrator.api.origins import origins_middleware, stamp_cors
from orchestrator.api.outcome import outcome_middleware
from orchestrator.api.preparation import most_prompt_chars
from orchestrator.api.record import record_of
from orchestrator.api.responses_api import routes as responses_api
from orchestrator.api.state import STATE, AppState
from orchestrator.api.tokenize import detokenize, tokenize
from orchestrator.api.wire import ChatCompletionRequest, CompletionRequest
from orchestrator.config import ServerConfig
from orchestrator.engine.catalogue import Catalogue
from orchestrator.engine.manifest import EngineManifest
from orchestrator.metrics.engine_collector import EngineCollector
from orchestrator.metrics.event_loop import EventLoopCollector
from orchestrator.metrics.http_metrics import HttpDurations
from orchestrator.metrics.registry import new_registry
from orchestrator.metrics.request_metrics import RequestMetrics
from orchestrator.metrics.scheduler_events import SchedulerMetrics
from orchestrator.metrics.simulation import register_simulation_info
from orchestrator.scheduler import ModelSnapshot, Scheduler
from orchestrator.store import open_store
from orchestrator.structured.checker import GrammarChecker
from orchestrator.supervisor.handle import WorkerSource
from orchestrator.supervisor.pool import WorkerPool

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
        "root": model.name,  # vLLM's fields, which its benchmark client reads: the served model, no parent
        "parent": None,
        "max_model_len": manifest.limits.max_seq_len,
        "backend": model.backend,
        "state": model.state,
        "simulated": manifest.simulation is not None,  # a sim engine: GPU rates without a GPU, synthetic text
        **({"simulation": manifest.simulation.model_dump()} if manifest.simulation else {}),
    }


def _model_cards(state: AppState, names: list[str]) -> dict[str, dict]:
    engines = state.catalogue.engines
    return {m.name: _model_card(m, engines[m.name].manifest) for m in state.scheduler.snapshot() if m.name in names}


async def list_models(http: web.Request) -> web.Response:
    """The models the caller's key may use."""
    names = visible_models(http)
    cards = _model_cards(http.app[STATE], names)
    return json_response({"object": "list", "data": [cards[name] for name in names]})


async def get_model(http: web.Request) -> web.Response:
    name = http.match_info["model"]
    model_view(http, name)  # 404 (also for a model the key may not use) / 503 with the reason
    return json_response(_model_cards(http.app[STATE], [name])[name])


async def health(http: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(http: web.Request) -> web.Response:
    """200 while serving (see Scheduler.ready), else 503; every model's state, and the models whose last load
    failed or whose worker died, with why and when they are tried again. With keys configured, that detail is
    for admin keys only: others learn whether the server is ready."""
    state = http.app[STATE]
    scheduler, caller = state.scheduler, record_of(http).caller
    if state.keys.configured and (caller is None or not caller.admin):
        return json_response({"ready": scheduler.ready}, 200 if scheduler.ready else 503)
    snapshot = scheduler.snapshot()
    failing = {
        m.name: {"state": m.state, "error": m.last_error, "retry_in_s": m.retry_in_s}
        for m in snapshot if m.last_error is not None
    }
    body = {"ready": scheduler.ready, "models": {m.name: m.state for m in snapshot}, "failing": failing}
    return json_response(body, 200 if scheduler.ready else 503)


async def metrics(http: web.Request) -> web.Response:
    state = http.app[STATE]
    await state.engine_collector.refresh()
    return web.Response(body=generate_latest(state.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(config: ServerConfig, catalogue: Catalogue, workers: WorkerSource | None = None) -> web.Application:
    """The app over the catalogue's models; `workers` defaults to worker processes with a spare kept ready."""
    registry = new_registry()
    if workers is None:
        backends = tuple(sorted({e.manifest.backend for e in catalogue.engines.values()}))
        workers = WorkerPool.for_config(config, backends, cores=os.cpu_count() or 1)
    keys = load_keys(config.auth, list(catalogue.engines))
    refuse_open_exposure(config.host, keys)
    for engine in catalogue.engines.values():
        most_prompt_chars(engine)  # read each tokenizer's vocabulary now, not during the first request
    scheduler = Scheduler(config, catalogue, workers, events=SchedulerMetrics(registry, catalogue.engines))
    engine_collector = EngineCollector(scheduler, catalogue.engines)
    registry.register(engine_collector)
    registry.register(EventLoopCollector())
    register_simulation_info(registry, catalogue.engines)
    usage, audit = UsageMeter(registry), AuditLog(config.audit.file, config.audit.include_text)
    grammar = GrammarChecker(
        time_limit_s=config.structured.compile_timeout_s, cache_entries=config.structured.cache_entries,
        processes=config.structured.checker_processes, per_key=config.structured.checks_per_key,
        wait_s=config.structured.check_wait_s, step_budget_ms=config.structured.step_budget_ms,
    )
    app = web.Application(
        middlewares=[
            outcome_middleware(HttpDurations(registry), Accounting(usage, audit)),  # first in, last out
            errors_middleware,
            origins_middleware(config.http.allowed_origins),
            auth_middleware(keys),
        ],
        client_max_size=config.http.max_body_bytes,
    )
    app[STATE] = AppState(
        config, catalogue, scheduler, registry, RequestMetrics(registry), engine_collector, grammar,
        keys=keys, limits=KeyLimiters(time.monotonic), usage=usage, audit=audit,
    )
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
    responses_api.add_routes(app)
    messages_api.add_routes(app)
    app.on_response_prepare.extend([stamp_request_id, stamp_cors])
    app.on_shutdown.append(_drain_on_shutdown)
    app.cleanup_ctx.extend([_store_lifetime, _scheduler_lifetime])  # cleaned up in reverse: the store last
    return app


def runner_options(config: ServerConfig) -> dict:
    """aiohttp runner settings the config decides (the real server's and the in-process tests' alike)."""
    return {"keepalive_timeout": config.http.header_timeout_s}


async def _scheduler_lifetime(app: web.Application):
    """Start the scheduler with the app (its initial loads in a task: /health answers meanwhile, /ready says
    when they are done); stop it, and every worker, when the app is cleaned up."""
    state = app[STATE]
    state.initial_loads = asyncio.create_task(state.scheduler.start(), name="initial-loads")
    yield
    state.initial_loads.cancel()
    await state.scheduler.stop(state.config.drain_timeout_s)
    await state.grammar.close()
    state.audit.close()


async def _store_lifetime(app: web.Application):
    """Open the response store before the scheduler starts; close it after the scheduler has drained and
    stopped, so the responses that finish during the drain are kept (a background response still running then is
    cancelled, and kept as cancelled, first)."""
    state = app[STATE]
    state.store = await open_store(state.config)
    yield
    await state.background.close()
    if state.store is not None:
        await state.store.close()


async def _drain_on_shutdown(app: web.Application) -> None:
    """Shutdown begins: refuse new requests, turn queued ones away, stop initial loads; running ones go on."""
    state = app[STATE]
    if state.initial_loads is not None:
        state.initial_loads.cancel()
    state.scheduler.begin_drain()
