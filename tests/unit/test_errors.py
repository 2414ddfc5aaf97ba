"""One table maps every error to its status and OpenAI's error shape."""

from __future__ import annotations

import pytest

from orchestrator import errors


@pytest.mark.parametrize(
    "error, status, code",
    [
        (errors.InvalidRequest("x"), 400, None),
        (errors.ContextLengthExceeded("x"), 400, "context_length_exceeded"),
        (errors.UnsupportedParameter("x"), 400, "unsupported_parameter"),
        (errors.ModelNotFound("x"), 404, "model_not_found"),
        (errors.MethodNotAllowed("x"), 405, "method_not_allowed"),
        (errors.OriginNotAllowed("x"), 403, "origin_not_allowed"),
        (errors.RequestTimeout("x"), 408, "request_timeout"),
        (errors.PayloadTooLarge("x"), 413, "payload_too_large"),
        (errors.UnsupportedMediaType("x"), 415, "unsupported_media_type"),
        (errors.QueueFull("x"), 429, "queue_full"),
        (errors.RateLimited("x"), 429, "rate_limit_exceeded"),
        (errors.EngineError("x"), 500, "engine_error"),
        (errors.BackendUnavailable("x"), 503, "backend_unavailable"),
        (errors.OutOfMemory("x"), 503, "out_of_memory"),
        (errors.WorkerCrashed("x"), 503, "worker_crashed"),
        (errors.StoreUnavailable("x"), 503, "store_unavailable"),
        (errors.StorageFull("x"), 507, "storage_full"),
        (RuntimeError("secret internals"), 500, "internal_error"),
        (errors.InternalError("x"), 500, "internal_error"),
    ],
)
def test_status_and_code(error, status, code):
    assert errors.kind_of(error).status == status
    body = errors.error_body(error)["error"]
    assert body["code"] == code
    assert set(body) == {"message", "type", "param", "code"}


def test_a_request_id_travels_in_the_error_object():
    body = errors.error_body(errors.QueueFull("busy"), request_id="req_1")["error"]
    assert body["request_id"] == "req_1" and body["message"] == "busy"


def test_unknown_exceptions_do_not_leak_their_text():
    assert errors.error_body(RuntimeError("secret"))["error"]["message"] == "internal server error"


def test_errors_cross_the_worker_boundary_as_the_same_class():
    crossed = errors.from_wire(errors.to_wire(errors.OutOfMemory("no room")))
    assert type(crossed) is errors.OutOfMemory and crossed.message == "no room"
    assert type(errors.from_wire({"kind": "Nonsense", "message": "m"})) is errors.EngineError
