"""Every error as OpenAI's JSON error (Anthropic's under its API's paths), with the status from the one table (errors.py) and the request's id in
the body, in the `X-Request-Id` header and in the log. aiohttp's own refusals (no such route, wrong method, a
body over the size limit) are turned into the taxonomy's classes; an unexpected exception is logged with its
traceback and answered as a 500 without internals (once a stream has begun, the connection is closed). A
client that went away hears nothing and is no error: its connection is closed without a log entry."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from orchestrator.api.http import error_response, json_response
from orchestrator.api.record import record_of
from orchestrator.api.state import STATE
from orchestrator.errors import InfernoError, MethodNotAllowed, NotFound, PayloadTooLarge
from orchestrator.metrics.http_metrics import CLIENT_GONE

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"


def from_aiohttp(http: web.Request, exc: web.HTTPException) -> InfernoError | None:
    """The taxonomy's error for one of aiohttp's own refusals; None for one it has no class for."""
    if isinstance(exc, web.HTTPNotFound):
        return NotFound(f"no such endpoint: {http.method} {http.path}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"{http.method} is not allowed on {http.path}")
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = http.app[STATE].config.http.max_body_bytes
        return PayloadTooLarge(f"the request body is larger than this server accepts ({limit} bytes)")
    return None


def _other_http_error(exc: web.HTTPException, request_id: str) -> web.Response:
    """An aiohttp refusal the taxonomy has no class for: its own status, in OpenAI's shape."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    body = {"message": exc.reason, "type": kind, "param": None, "code": None, "request_id": request_id}
    return json_response({"error": body}, exc.status)


@web.middleware
async def errors_middleware(http: web.Request, handler) -> web.StreamResponse:
    request_id = record_of(http).id
    try:
        return await handler(http)
    except InfernoError as exc:
        return error_response(exc, request_id, http.path)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # a redirect or the like: not an error
        error = from_aiohttp(http, exc)
        return _other_http_error(exc, request_id) if error is None else error_response(error, request_id, http.path)
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        return client_gone(http)
    except Exception as exc:
        log.exception("unexpected error on %s %s (request %s)", http.method, http.path, request_id)
        if http.writer.output_size > 0:
            raise  # a stream has begun: aiohttp closes the connection
        return error_response(exc, request_id, http.path)


def client_gone(http: web.Request) -> web.Response:
    """The answer to a request whose client went away: its connection is closed (if it is not already) and the
    499 returned is never written: aiohttp drops a response it cannot send without logging. (Raised on, the
    ConnectionResetError would be logged by aiohttp as an error with its traceback, for every such client.)"""
    transport = http.transport
    if transport is not None and not transport.is_closing():
        transport.abort()
    return web.Response(status=CLIENT_GONE)


async def stamp_request_id(http: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every response, streams included, names its request."""
    response.headers[REQUEST_ID_HEADER] = record_of(http).id
