"""The Messages API's routes: `POST /v1/messages` through the same preparation and generation path as chat, and
`POST /v1/messages/count_tokens`, the prompt a generation would make, counted. Any query string is accepted
(Claude Code sends `?beta=true`), and so are the `anthropic-version` and `anthropic-beta` headers."""

from __future__ import annotations

from aiohttp import web

from orchestrator.api.access import model_view
from orchestrator.api.body import off_loop, parse
from orchestrator.api.generation import serve_events
from orchestrator.api.http import json_response
from orchestrator.api.messages_api.presenter import MessagesPresenter
from orchestrator.api.messages_api.wire import CountTokensRequest, MessagesRequest

ID_PREFIX = "msg"


async def create_message(http: web.Request) -> web.StreamResponse:
    wire = await parse(http, MessagesRequest)
    return await serve_events(http, wire, lambda _: MessagesPresenter(wire), ID_PREFIX)


async def count_tokens(http: web.Request) -> web.Response:
    wire = await parse(http, CountTokensRequest)
    engine = model_view(http, wire.model).engine
    prompt = await off_loop(http, wire.prompt_ids, engine, prompts=engine.prompts)
    return json_response({"input_tokens": len(prompt)})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
