"""Background responses (`background: true`): the request is prepared and checked while its client waits (a bad
request is still a 400), kept as `queued`, and answered at once; the generation then runs in a task of its own,
through the same lease and worker as any request, and the kept response follows it: `in_progress`, then
`completed`, `incomplete`, `failed` or `cancelled`. The client polls `GET /v1/responses/{id}`.

The API key's limits hold until the task ends (the request's accounting is settled then, not when the first
answer is sent). On shutdown the scheduler's drain lets running background responses finish like any request;
what is left when the app is cleaned up is cancelled, and kept as such, before the store closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from orchestrator.api.generation import collect, running
from orchestrator.api.preparation import Prepared
from orchestrator.api.record import record_of
from orchestrator.errors import InfernoError, error_body
from orchestrator.store import ResponseStore

log = logging.getLogger(__name__)


async def run_in_background(http: web.Request, prepared: Prepared, store: ResponseStore, queued: dict,
                            finished: Callable[[object], dict]) -> None:
    """The generation of a kept `queued` response; `finished(request)` renders the final response object."""
    response_id = queued["id"]
    request = prepared.request
    try:
        await store.update(response_id, status="in_progress", response={**queued, "status": "in_progress"})
        async with running(http, prepared):
            await collect(request)
        body = {**finished(request), "background": True}
        await store.update(response_id, status=body["status"], response=body)
    except asyncio.CancelledError:
        await _keep_end(store, queued, "cancelled", None)
        raise
    except InfernoError as exc:
        await _keep_end(store, queued, "failed", error_body(exc, record_of(http).id)["error"])
    except Exception:
        log.exception("background response %s failed", response_id)
        await _keep_end(store, queued, "failed", {"code": "server_error", "message": "internal server error"})


async def _keep_end(store: ResponseStore, queued: dict, status: str, error: dict | None) -> None:
    body = {**queued, "status": status, "error": error and {"code": error.get("code") or error.get("type"),
                                                            "message": error["message"]}}
    try:
        await asyncio.shield(store.update(queued["id"], status=status, response=body))
    except InfernoError as exc:
        log.error("background response %s ended %s but could not be kept: %s", queued["id"], status, exc.message)
