"""Invalid requests a soak run sends, and the one answer each must get: a 4xx status with OpenAI's error
object, `{"error": {"message": str, "type": str, "param": ..., "code": ...}}`. A 2xx, a 5xx, or a body that
is not that JSON is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from bench.soak.requests import Body, Outcome
from orchestrator.bench.http_client import ConnectionPool, HttpError, post_pooled


@dataclass(frozen=True)
class BadRequest:
    name: str
    path: str
    body: bytes
    content_type: str | None = "application/json"


def _json(value: object) -> bytes:
    return orjson.dumps(value)


def bad_requests(model: str) -> list[BadRequest]:
    """Every invalid request the soak sends to a server serving `model`."""
    chat, text = "/v1/chat/completions", "/v1/completions"
    hello = [{"role": "user", "content": "hello"}]
    return [
        BadRequest("messages not a list", chat, _json({"model": model, "messages": "hello"})),
        BadRequest("max_tokens a string", text, _json({"model": model, "prompt": "hi", "max_tokens": "ten"})),
        BadRequest("unknown field", chat, _json({"model": model, "messages": hello, "frobnicate": 1})),
        BadRequest("huge max_tokens", text, b'{"model": "%s", "prompt": "hi", "max_tokens": 1%s}' % (model.encode(), b"0" * 40)),
        BadRequest("temperature beyond float", chat,
                   b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "temperature": 1e999}' % model.encode()),
        BadRequest("negative max_tokens", text, _json({"model": model, "prompt": "hi", "max_tokens": -5})),
        BadRequest("n zero", chat, _json({"model": model, "messages": hello, "n": 0})),
        BadRequest("empty messages", chat, _json({"model": model, "messages": []})),
        BadRequest("unknown role", chat, _json({"model": model, "messages": [{"role": "wizard", "content": "x"}]})),
        BadRequest("stream_options without stream", text,
                   _json({"model": model, "prompt": "hi", "stream_options": {"include_usage": True}})),
        BadRequest("unknown model", chat, _json({"model": "no-such-model", "messages": hello})),
        BadRequest("no model", text, _json({"prompt": "hi"})),
        BadRequest("not JSON", chat, b'{"model": "' + model.encode() + b'", "messages": [}'),
        BadRequest("empty body", text, b""),
        BadRequest("a JSON array", chat, b"[]"),
        BadRequest("invalid UTF-8", text, b'{"model": "' + model.encode() + b'", "prompt": "\xff\xfe"}'),
        BadRequest("nested 5000 deep", text, b'{"model": "x", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        BadRequest("text/plain", chat, _json({"model": model, "messages": hello}), "text/plain"),
        BadRequest("no content type", text, _json({"model": model, "prompt": "hi"}), None),
        BadRequest("form-encoded", text, b"model=x&prompt=hi", "application/x-www-form-urlencoded"),
    ]


def raw_request(pool: ConnectionPool, bad: BadRequest) -> bytes:
    lines = [f"POST {bad.path} HTTP/1.1", f"Host: {pool.host_header}", f"Content-Length: {len(bad.body)}"]
    if bad.content_type is not None:
        lines.append(f"Content-Type: {bad.content_type}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + bad.body


def openai_error(body: bytes | bytearray) -> str | None:
    """What is wrong with an error body, or None when it is OpenAI's error object."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "not JSON"
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return "no error object"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "error without message or type"
    if "param" not in error or "code" not in error:
        return "error without param or code"
    return None


async def send_bad(pool: ConnectionPool, bad: BadRequest, timeout_s: float) -> tuple[Outcome, int | None]:
    """The outcome, and the status the server answered with (None when it did not answer)."""
    body = Body()
    try:
        status, connection = await post_pooled(pool, raw_request(pool, bad), body, timeout_s)
    except (HttpError, OSError) as exc:
        return Outcome("bad", type(exc).__name__, f"{bad.name}: {str(exc)[:160]}"), None
    answer = connection.error_body if status != 200 else body.data
    if not 400 <= status < 500:
        return Outcome("bad", f"HTTP {status}", f"{bad.name}: {bytes(answer[:160]).decode(errors='replace')}"), status
    problem = openai_error(answer)
    if problem is not None:
        return Outcome("bad", f"4xx {problem}", f"{bad.name}: {bytes(answer[:160]).decode(errors='replace')}"), status
    return Outcome("bad"), status
