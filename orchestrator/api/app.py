"""The aiohttp application: routes, the error middleware, and the start/stop of the scheduler."""

from __future__ import annotations

from datetime import datetime

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from orchestrator.api import admin
from orchestrator.api.auth import auth_middleware
from orchestrator.api.generation import serve_generation
from orchestrator.api.responses import Format
from orchestrator.api.state import STATE, AppState
from orchestrator.api.wire import ChatCompletionRequest, CompletionRequest, field_path
from orchestrator.config import ServerConfig
from orchestrator.engine.manifest import EngineManifest
from orchestrator.errors import InfernoError, InvalidRequest, NotFound, error_body, kind_of
from orchestrator.metrics.engine_collector import EngineCollector
from orchestrator.metrics.http_metrics import http_metrics_middleware
from orchestrator.metrics.registry import new_registry
from orchestrator.metrics.request_metrics import RequestMetrics
from orchestrator.metrics.scheduler_events import SchedulerMetrics
from orchestrator.metrics.simulation import register_simulation_info
from orchestrator.scheduler.observe import ModelSnapshot
from orchestrator.scheduler.registry import Catalogue
from orchestrator.scheduler.scheduler import Scheduler

CHAT = Format("chat.completion", "chat.completion.chunk", chat=True)
TEXT = Format("text_completion", "text_completion", chat=False)


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def error_response(error: BaseException) -> web.Response:
    headers = None
    if isinstance(error, InfernoError) and error.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, round(error.retry_after_s)))}
    return json_response(error_body(error), kind_of(error).status, headers)


async def parse(http: web.Request, wire_type: type[BaseModel]) -> BaseModel:
    body = await http.read()
    try:
        return wire_type.model_validate_json(body, strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise InvalidRequest(f"the request body is not valid JSON: {first['msg']}") from exc
        where = field_path(first["loc"])
        detail = first["msg"]
        if first["type"] == "extra_forbidden":
            where = ".".join(str(p) for p in first["loc"])
            detail = "unrecognised request argument"
        given = first.get("input")
        shown = "" if first["type"] in ("missing", "extra_forbidden") else f" (got {given!r:.80})"
        raise InvalidRequest(f"{where}: {detail}{shown}", param=where or None) from exc


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
    try:
        return await handler(http)
    except InfernoError as exc:
        return error_response(exc)
    except web.HTTPNotFound:
        return error_response(NotFound(f"no such endpoint: {http.method} {http.path}"))
    except web.HTTPMethodNotAllowed as exc:
        return json_response(
            {"error": {"message": f"{http.method} is not allowed on {http.path}", "type": "invalid_request_error",
                       "param": None, "code": "method_not_allowed"}},
            exc.status,
        )


def build_app(config: ServerConfig, catalogue: Catalogue) -> web.Application:
    registry = new_registry()
    scheduler = Scheduler(config, catalogue, events=SchedulerMetrics(registry, catalogue.engines))
    engine_collector = EngineCollector(scheduler)
    registry.register(engine_collector)
    register_simulation_info(registry, catalogue.engines)
    app = web.Application(
        middlewares=[http_metrics_middleware(registry), errors_middleware, auth_middleware(config.auth)],
        client_max_size=64 * 2**20,
    )
    app[STATE] = AppState(config, catalogue, scheduler, registry, RequestMetrics(registry), engine_collector)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    admin.add_routes(app)
    app.on_shutdown.append(_on_shutdown)
    app.cleanup_ctx.append(_stop_workers_on_cleanup)
    return app


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].scheduler.begin_drain()


async def _stop_workers_on_cleanup(app: web.Application):
    yield
    state = app[STATE]
    await state.scheduler.stop(state.config.drain_timeout_s)
