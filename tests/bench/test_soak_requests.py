"""The soak run's request checks on plain bytes: OpenAI's error object, a stream's end and finish reason, a
planned cut; and that the traffic is decided by its seed."""

from __future__ import annotations

import random

import orjson

from bench.soak.bad_requests import bad_requests, openai_error
from bench.soak.requests import CheckedStream, _check_stream
from bench.soak.traffic import Mix, generation
from orchestrator.bench.http_client import Connection
from orchestrator.bench.record import RequestTiming


def test_only_openai_error_objects_pass():
    good = {"error": {"message": "max_tokens must be at least 1", "type": "invalid_request_error",
                      "param": "max_tokens", "code": None}}
    assert openai_error(orjson.dumps(good)) is None
    assert openai_error(b"500 Internal Server Error") == "not JSON"
    assert openai_error(b'{"detail": "bad"}') == "no error object"
    assert openai_error(b'{"error": "bad"}') == "no error object"
    assert openai_error(b'{"error": {"message": "bad", "type": "x"}}') == "error without param or code"
    assert openai_error(b'{"error": {"message": 1, "type": "x", "param": null, "code": null}}') \
        == "error without message or type"


def test_every_invalid_request_has_its_own_name():
    catalogue = bad_requests("m")
    assert len({bad.name for bad in catalogue}) == len(catalogue) >= 20
    assert {bad.content_type for bad in catalogue} >= {"application/json", "text/plain", None}


def chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return b"data: " + orjson.dumps({"object": "text_completion", "choices": [choice]}) + b"\n\n"


def test_a_stream_passes_only_with_a_finish_reason_and_done():
    whole = CheckedStream(RequestTiming("m", 0.0), chat=False, cut_after_events=None)
    whole.feed(chunk("Hello") + chunk(" world"), 1.0)
    whole.feed(chunk("", "length") + b"data: [DONE]\n\n", 2.0)
    assert (whole.done, whole.finish_reason) == (True, "length")
    assert _check_stream("stream", whole).failure is None

    unfinished = CheckedStream(RequestTiming("m", 0.0), chat=False, cut_after_events=None)
    unfinished.feed(chunk("Hello") + b"data: [DONE]\n\n", 1.0)
    assert _check_stream("stream", unfinished).failure == "no finish reason"

    cut_short = CheckedStream(RequestTiming("m", 0.0), chat=False, cut_after_events=None)
    cut_short.feed(chunk("Hello", "stop"), 1.0)
    assert _check_stream("stream", cut_short).failure == "no [DONE]"

    errored = CheckedStream(RequestTiming("m", 0.0), chat=False, cut_after_events=None)
    errored.feed(b'data: {"error": {"message": "engine died"}}\n\ndata: [DONE]\n\n', 1.0)
    assert _check_stream("stream", errored).failure == "error event in the stream"


def test_a_planned_cut_closes_the_connection_at_its_event():
    stream = CheckedStream(RequestTiming("m", 0.0), chat=False, cut_after_events=2)
    stream.connection = Connection()  # not connected: closing it does nothing but mark the cut
    stream.feed(chunk("a"), 1.0)
    assert not stream.cut
    stream.feed(chunk("b"), 2.0)
    assert stream.cut


def test_the_traffic_is_decided_by_its_seed():
    def requests(seed: str) -> list:
        rng = random.Random(seed)
        return [generation(rng, "m", Mix()) for _ in range(200)]

    first, again, other = requests("7:sim:hot:0"), requests("7:sim:hot:0"), requests("8:sim:hot:0")
    assert first == again and first != other
    cuts = [g for g in first if g.cut_after_events is not None or g.cut_after_s is not None]
    assert cuts and all(g.stream for g in cuts)
    assert all(1 <= g.cut_after_events <= g.max_tokens for g in cuts if g.cut_after_events is not None)
    assert {g.stream for g in first} == {True, False} and {g.chat for g in first} == {True, False}
