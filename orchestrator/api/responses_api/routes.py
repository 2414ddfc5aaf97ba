"""`POST /v1/responses`: the Responses API's front door, through the same preparation and generation path as chat.

A finished response, and the input it answered as items, go to `_remember`: the one place the response store will
keep them (for `store`, `previous_response_id`, `background` and `GET /v1/responses/{id}`, which need it).
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel

from orchestrator.api.body import parse
from orchestrator.api.generation import serve_events
from orchestrator.api.preparation import prepare_generation
from orchestrator.api.responses_api.presenter import ResponsesPresenter
from orchestrator.api.responses_api.wire import ResponsesRequest

ID_PREFIX = "resp"


async def create_response(http: web.Request) -> web.StreamResponse:
    wire = await parse(http, ResponsesRequest)
    prepared = await prepare_generation(http, wire, ID_PREFIX)
    presenter = ResponsesPresenter(wire, prepared)
    reply = await serve_events(http, wire, lambda _: presenter, ID_PREFIX, prepared)
    if presenter.final is not None and wire.store is not False:
        _remember(presenter.final, input_items(wire))
    return reply


def input_items(wire: ResponsesRequest) -> list[dict]:
    """The conversation the response answered, as Responses API items (a string input is one user message)."""
    return [_item(item) for item in wire.input_items()]


def _item(item: BaseModel) -> dict:
    return item.model_dump(by_alias=True, exclude_none=True)


def _remember(response: dict, items: list[dict]) -> None:
    """Keep a finished response and its input items, for the response store to serve later (not kept yet)."""


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create_response)
