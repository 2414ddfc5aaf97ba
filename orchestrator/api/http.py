"""JSON in and out of aiohttp: validating a body into a wire type with errors that name the field, and
OpenAI-shaped responses, errors included (Anthropic-shaped under its API's paths)."""

from __future__ import annotations

import math

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from orchestrator.api.wire import field_path
from orchestrator.errors import InfernoError, InvalidRequest, anthropic_error_body, error_body, kind_of


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


ANTHROPIC_PATHS = "/v1/messages"  # Anthropic's API: its errors in Anthropic's shape


def error_response(error: BaseException, request_id: str | None = None, path: str = "") -> web.Response:
    """The error as JSON with the table's status, in the shape of the API `path` belongs to."""
    headers = None
    if isinstance(error, InfernoError) and error.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
    shape = anthropic_error_body if path.startswith(ANTHROPIC_PATHS) else error_body
    return json_response(shape(error, request_id), kind_of(error).status, headers)


def validate(body: bytes, wire_type: type[BaseModel]) -> BaseModel:
    """The body as `wire_type`, strictly; InvalidRequest naming the first field that is wrong."""
    try:
        return wire_type.model_validate_json(body, strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise InvalidRequest(f"the request body is not valid JSON: {first['msg']}") from exc
        where = field_path(first["loc"], wire_type)
        detail = first["msg"]
        if first["type"] == "extra_forbidden":
            parent = field_path(first["loc"][:-1], wire_type)
            where = f"{parent}.{first['loc'][-1]}" if parent else str(first["loc"][-1])
            detail = "unrecognised request argument"
        given = first.get("input")
        shown = "" if first["type"] in ("missing", "extra_forbidden") else f" (got {given!r:.80})"
        raise InvalidRequest(f"{where}: {detail}{shown}", param=where or None) from exc
