"""The Responses API's routes: `POST /v1/responses` through the same preparation and generation path as chat, and
the kept responses' routes (stored.py). A request that names `previous_response_id` continues the kept
conversation; a finished response is kept unless `store` is false; `background: true` answers at once with the
kept `queued` response and generates in a task of its own (background.py).
"""

from __future__ import annotations

from aiohttp import web

from orchestrator.api.body import parse
from orchestrator.api.generation import serve_events
from orchestrator.api.http import json_response
from orchestrator.api.preparation import prepare_generation
from orchestrator.api.record import record_of
from orchestrator.api.responses_api import stored
from orchestrator.api.responses_api.background import run_in_background
from orchestrator.api.responses_api.presenter import ResponsesPresenter
from orchestrator.api.responses_api.wire import ResponsesRequest
from orchestrator.api.state import STATE
from orchestrator.errors import InvalidRequest

ID_PREFIX = "resp"


async def create_response(http: web.Request) -> web.StreamResponse:
    wire = await parse(http, ResponsesRequest)
    if wire.previous_response_id is not None:
        wire = wire.continuing(await stored.conversation(http, wire.previous_response_id))
    if wire.background:
        return await _create_in_background(http, wire)
    prepared = await prepare_generation(http, wire, ID_PREFIX)
    presenter = ResponsesPresenter(wire, prepared)
    reply = await serve_events(http, wire, lambda _: presenter, ID_PREFIX, prepared)
    if presenter.final is not None and wire.store is not False:
        await stored.remember(http, presenter.final, input_items(wire), wire.previous_response_id)
    return reply


async def _create_in_background(http: web.Request, wire: ResponsesRequest) -> web.Response:
    if wire.store is False:
        raise InvalidRequest("background responses are kept to be read back: background needs store true",
                             param="store")
    if wire.stream:
        raise InvalidRequest("a background response is not streamed here: leave out stream and poll "
                             "GET /v1/responses/{id}", param="stream")
    store = stored.store_for(http, "background")
    prepared = await prepare_generation(http, wire, ID_PREFIX)  # a bad request is refused now, with its 400
    presenter = ResponsesPresenter(wire, prepared)
    queued = {**presenter.opening(prepared.request)[0][1]["response"], "status": "queued"}
    await stored.remember(http, queued, input_items(wire), wire.previous_response_id)
    work = run_in_background(http, prepared, store, queued, presenter.response)
    record_of(http).detached = http.app[STATE].background.start(queued["id"], work)
    return json_response(queued)


def input_items(wire: ResponsesRequest) -> list[dict]:
    """The conversation the response answered, as Responses API items (a string input is one user message)."""
    return [item.model_dump(by_alias=True, exclude_none=True) for item in wire.input_items()]


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", stored.retrieve)
    app.router.add_delete("/v1/responses/{response_id}", stored.delete)
    app.router.add_post("/v1/responses/{response_id}/cancel", stored.cancel)

