"""The Responses API's kept responses: what `store` keeps, how `previous_response_id` continues a conversation, and
the routes that read one back (`GET /v1/responses/{id}`, also replayed as its stream), forget it (`DELETE`) or
cancel a background one (`POST /v1/responses/{id}/cancel`).

A response is kept in the response store (orchestrator/store/) under the API key that made it: another key, or a
caller without one when keys are set, finds nothing there (404, as for an id that never existed). A response that
could not be kept (a full disk) is still returned to its client; the failure is logged.
"""

from __future__ import annotations

import logging

from aiohttp import web

from orchestrator.access.keys import ANONYMOUS
from orchestrator.api.generation import Event, event_bytes
from orchestrator.api.http import json_response
from orchestrator.api.record import record_of
from orchestrator.api.state import STATE
from orchestrator.errors import InfernoError, InvalidRequest, NotFound, UnsupportedParameter
from orchestrator.store import ResponseStore, StoredResponse

log = logging.getLogger(__name__)


def owner_of(http: web.Request) -> str:
    """Whose responses a request reads and writes: its API key's name."""
    return (record_of(http).caller or ANONYMOUS).name


def store_for(http: web.Request, param: str) -> ResponseStore:
    """The server's response store; a 400 naming `param` (the field that needs it) when it has none."""
    store = http.app[STATE].store
    if store is None:
        raise UnsupportedParameter(
            f"{param} needs the response store, which is turned off on this server (--no-store.enabled) or could not "
            "be opened; send the whole conversation as input instead", param=param)
    return store


async def conversation(http: web.Request, previous_response_id: str) -> list[dict]:
    """The input items that continue `previous_response_id` (what it answered, then its output)."""
    items = await store_for(http, "previous_response_id").conversation(previous_response_id, owner_of(http))
    if items is None:
        raise NotFound(f"previous response {previous_response_id!r} not found", param="previous_response_id")
    return items


async def remember(http: web.Request, response: dict, input_items: list[dict], previous: str | None) -> None:
    """Keep a response and the conversation it answered; a failure to keep it is logged, the response stands."""
    store = http.app[STATE].store
    if store is None:
        return
    stored = StoredResponse(id=response["id"], owner=owner_of(http), model=response["model"],
                            created_at=response["created_at"], status=response["status"], response=response,
                            input_items=input_items, previous_response_id=previous)
    try:
        await store.put(stored)
    except InfernoError as exc:
        log.error("response %s was answered but not kept: %s", response["id"], exc.message)


async def _kept(http: web.Request) -> StoredResponse:
    response_id = http.match_info["response_id"]
    stored = await store_for(http, "response_id").get(response_id, owner_of(http))
    if stored is None:
        raise NotFound(f"response {response_id!r} not found", param="response_id")
    return stored


async def retrieve(http: web.Request) -> web.StreamResponse:
    """`GET /v1/responses/{id}`: the response as last kept; `?stream=true` replays it as its events (from
    `starting_after`, a sequence number, when given)."""
    stored = await _kept(http)
    if http.query.get("stream", "false").lower() != "true":
        return json_response(stored.response)
    after = _sequence_number(http.query.get("starting_after"))
    events = [event for event in replay(stored.response) if event[1]["sequence_number"] > after]
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await reply.prepare(http)
    await reply.write(event_bytes(events))
    await reply.write_eof()
    return reply


def _sequence_number(given: str | None) -> int:
    if given is None:
        return -1
    if not given.lstrip("-").isdigit():
        raise InvalidRequest(f"starting_after must be an event's sequence number (got {given!r:.40})",
                             param="starting_after")
    return int(given)


async def delete(http: web.Request) -> web.Response:
    """`DELETE /v1/responses/{id}`: forgets it (a background response still running is cancelled first)."""
    stored = await _kept(http)
    await http.app[STATE].background.cancel(stored.id)
    await http.app[STATE].store.delete(stored.id, stored.owner)
    return json_response({"id": stored.id, "object": "response.deleted", "deleted": True})


async def cancel(http: web.Request) -> web.Response:
    """`POST /v1/responses/{id}/cancel`: stops a background response; one already finished is returned as it is."""
    stored = await _kept(http)
    if not stored.response.get("background"):
        raise InvalidRequest(f"response {stored.id!r} was not created with background: true; only background "
                             "responses can be cancelled", param="response_id")
    await http.app[STATE].background.cancel(stored.id)
    return json_response((await _kept(http)).response)


# -- the events of a kept response --------------------------------------------------------------------------------
def replay(response: dict) -> list[Event]:
    """The events a stream of this response sent (each item's text as one delta), numbered from 0."""
    events: list[tuple[str, dict]] = []
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    if response["status"] == "queued":
        opening["status"] = "queued"
    events += [("response.created", {"response": opening})]
    if response["status"] != "queued":
        events += [("response.in_progress", {"response": opening})]
    for index, item in enumerate(response.get("output", [])):
        events += _item_events(index, item)
    terminal = {"completed": "response.completed", "incomplete": "response.incomplete",
                "failed": "response.failed", "cancelled": "response.failed"}.get(response["status"])
    if terminal is not None:
        events.append((terminal, {"response": response}))
    return [(name, {"type": name, **data, "sequence_number": n}) for n, (name, data) in enumerate(events)]


def _item_events(index: int, item: dict) -> list[tuple[str, dict]]:
    opened = {**item, "status": "in_progress"}
    where = {"item_id": item.get("id"), "output_index": index}
    events = []
    if item["type"] == "function_call":
        events = [("response.output_item.added", {"output_index": index, "item": opened}),
                  ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                  ("response.function_call_arguments.done", {**where, "name": item["name"],
                                                             "arguments": item["arguments"]})]
    elif item["type"] in ("message", "reasoning"):
        events = [("response.output_item.added", {"output_index": index, "item": {**opened, "content": []}})]
        for content_index, part in enumerate(item.get("content", [])):
            events += _part_events(item["type"], {**where, "content_index": content_index}, part)
    return [*events, ("response.output_item.done", {"output_index": index, "item": item})]


def _part_events(kind: str, where: dict, part: dict) -> list[tuple[str, dict]]:
    text = part.get("text", "")
    empty = {**part, "text": ""}
    if kind == "reasoning":
        body = [("response.reasoning_text.delta", {**where, "delta": text}),
                ("response.reasoning_text.done", {**where, "text": text})]
    else:
        logprobs = part.get("logprobs", [])
        empty["logprobs"] = [] if "logprobs" in part else empty.get("logprobs")
        body = [("response.output_text.delta", {**where, "delta": text, "logprobs": logprobs}),
                ("response.output_text.done", {**where, "text": text, "logprobs": logprobs})]
    return [("response.content_part.added", {**where, "part": {k: v for k, v in empty.items() if v is not None}}),
            *body, ("response.content_part.done", {**where, "part": part})]
