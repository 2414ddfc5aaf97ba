"""Every error a user can hit, in one taxonomy, and the one table that maps it to HTTP.

Layers below HTTP raise these (never HTTP status codes); the API layer turns any of them into OpenAI's
error shape, `{"error": {"message", "type", "param", "code"}}` (Anthropic's for its Messages API), both for
JSON responses and for the error event sent when a stream has already started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


class InfernoError(Exception):
    """Base class. `message` is shown to the user as is: name the field, the limit and the value given."""

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s


class InvalidRequest(InfernoError):
    """Malformed JSON, a wrong type, a value out of range."""


class UnsupportedParameter(InvalidRequest):
    """A valid OpenAI parameter this model's backend cannot honour."""


class ContextLengthExceeded(InvalidRequest):
    """Prompt (plus max_tokens) longer than the engine was built for."""


class NotFound(InfernoError):
    """No such endpoint."""


class ModelNotFound(NotFound):
    """No engine of that name."""


class MethodNotAllowed(InfernoError):
    """The endpoint exists, but not for this HTTP method."""


class Unauthorized(InfernoError):
    """Missing or wrong API key."""


class OriginNotAllowed(InfernoError):
    """A browser request from an origin the server is not configured to allow (CORS)."""


class RequestTimeout(InfernoError):
    """The request body did not arrive in time."""


class PayloadTooLarge(InfernoError):
    """The request body is larger than the server accepts."""


class UnsupportedMediaType(InfernoError):
    """A request body that is not JSON."""


class RateLimited(InfernoError):
    """The API key's requests or tokens per minute, or its concurrent requests, are used up: retry later."""


class QueueFull(InfernoError):
    """The model's queue is full: try again shortly."""


class ModelUnavailable(InfernoError):
    """The model cannot serve right now: loading failed, no memory to load it, its engine is refused."""


class BackendUnavailable(ModelUnavailable):
    """The backend's runtime is not installed (TensorRT-LLM missing, torch missing)."""


class OutOfMemory(ModelUnavailable):
    """The device has no room for the model or its KV cache."""


class WorkerCrashed(ModelUnavailable):
    """The model's worker process died while the request was in flight."""


class EngineDead(ModelUnavailable):
    """The engine stopped for good (its loop died): the worker exits so the model is loaded afresh."""


class EngineError(InfernoError):
    """The engine failed while running the request."""


class ShuttingDown(InfernoError):
    """The server is draining and takes no new requests."""


class StoreUnavailable(InfernoError):
    """The response store cannot read or write right now (its database failed, or none could be opened)."""


class StorageFull(StoreUnavailable):
    """The response store's disk is full: nothing more can be kept until space is freed."""


class InternalError(InfernoError):
    """Anything that is none of the above (a bug): any other exception is reported as this, without its text."""


@dataclass(frozen=True)
class ErrorKind:
    status: int
    type: str
    code: str | None


# The one table. Lookup walks the class's MRO, so subclasses inherit their parent's row unless listed.
ERROR_TABLE: dict[type[InfernoError], ErrorKind] = {
    InvalidRequest: ErrorKind(400, "invalid_request_error", None),
    UnsupportedParameter: ErrorKind(400, "invalid_request_error", "unsupported_parameter"),
    ContextLengthExceeded: ErrorKind(400, "invalid_request_error", "context_length_exceeded"),
    Unauthorized: ErrorKind(401, "authentication_error", "invalid_api_key"),
    OriginNotAllowed: ErrorKind(403, "invalid_request_error", "origin_not_allowed"),
    NotFound: ErrorKind(404, "invalid_request_error", "not_found"),
    ModelNotFound: ErrorKind(404, "invalid_request_error", "model_not_found"),
    MethodNotAllowed: ErrorKind(405, "invalid_request_error", "method_not_allowed"),
    RequestTimeout: ErrorKind(408, "invalid_request_error", "request_timeout"),
    PayloadTooLarge: ErrorKind(413, "invalid_request_error", "payload_too_large"),
    UnsupportedMediaType: ErrorKind(415, "invalid_request_error", "unsupported_media_type"),
    QueueFull: ErrorKind(429, "rate_limit_error", "queue_full"),
    RateLimited: ErrorKind(429, "rate_limit_error", "rate_limit_exceeded"),
    EngineError: ErrorKind(500, "server_error", "engine_error"),
    ModelUnavailable: ErrorKind(503, "service_unavailable", "model_unavailable"),
    BackendUnavailable: ErrorKind(503, "service_unavailable", "backend_unavailable"),
    OutOfMemory: ErrorKind(503, "service_unavailable", "out_of_memory"),
    WorkerCrashed: ErrorKind(503, "service_unavailable", "worker_crashed"),
    EngineDead: ErrorKind(503, "service_unavailable", "engine_stopped"),
    ShuttingDown: ErrorKind(503, "service_unavailable", "shutting_down"),
    StoreUnavailable: ErrorKind(503, "service_unavailable", "store_unavailable"),
    StorageFull: ErrorKind(507, "server_error", "storage_full"),
    InternalError: ErrorKind(500, "server_error", "internal_error"),
}


def kind_of(error: BaseException) -> ErrorKind:
    for cls in type(error).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    return ERROR_TABLE[InternalError]


def error_body(error: BaseException, request_id: str | None = None) -> dict:
    """OpenAI's error object for any exception; unknown ones are reported without internals. With a
    `request_id`, the error carries it too (the id the server's log and audit log know the request by)."""
    kind = kind_of(error)
    if isinstance(error, InfernoError):
        message, param = error.message, error.param
    else:
        message, param = "internal server error", None
    body = {"message": message, "type": kind.type, "param": param, "code": kind.code}
    if request_id is not None:
        body["request_id"] = request_id
    return {"error": body}


# Anthropic's error types (its Messages API's shape), by HTTP status; the status itself is the table's.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error_body(error: BaseException, request_id: str | None = None) -> dict:
    """The same error in Anthropic's shape, `{"type": "error", "error": {"type", "message"}, "request_id"}`;
    the field a 400 is about is named in its message, as Anthropic does."""
    openai = error_body(error)["error"]
    status = kind_of(error).status
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = openai["message"]
    if openai["param"] and openai["param"] not in message:
        message = f"{openai['param']}: {message}"
    body = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


# Errors cross the worker boundary by name, so the HTTP process re-raises the same class.
_BY_NAME = {cls.__name__: cls for cls in ERROR_TABLE}


def to_wire(error: InfernoError) -> dict:
    wire = {"kind": type(error).__name__, "message": error.message}
    if error.param is not None:
        wire["param"] = error.param
    if error.retry_after_s is not None:
        wire["retry_after_s"] = error.retry_after_s
    return wire


def from_wire(data: dict) -> InfernoError:
    cls = _BY_NAME.get(data.get("kind", ""), EngineError)
    return cls(data.get("message", "engine error"), param=data.get("param"), retry_after_s=data.get("retry_after_s"))


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])(?:/[\w.@+=,~-]+)+")


def without_paths(text: str, folder: Path | None = None) -> str:
    """`text` fit for a client: the engine folder `folder` named by its name alone (a file in it as
    `<name>/<file>`), any other absolute path by its last part. Where the server's files lie is not the
    client's business, and error text ends up in responses, /ready and the logs that users are shown."""
    if folder is not None:
        text = text.replace(str(folder.resolve()), folder.name).replace(str(folder), folder.name)
    return _ABSOLUTE_PATH.sub(lambda match: match.group(0).rsplit("/", 1)[-1], text)
