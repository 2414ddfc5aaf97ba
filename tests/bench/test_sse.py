"""The SSE counter and the HTTP framing under it, fed the bytes of real-shaped streams in every split."""

from __future__ import annotations

import asyncio
import itertools
import random

import orjson
import pytest

from orchestrator.bench.http_client import Connection
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.sse import SseCounter


def _event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chat_stream(texts: list[str], usage_tokens: int) -> bytes:
    """A chat stream as Inferno and OpenAI send it: role chunk, text chunks, finish chunk, usage, [DONE]."""
    envelope = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": None}

    def chunk(delta: dict, finish=None) -> bytes:
        return _event({**envelope, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                       "usage": None})

    out = chunk({"role": "assistant", "content": ""})
    out += b"".join(chunk({"content": t}) for t in texts)
    out += chunk({}, "length")
    usage = {"prompt_tokens": 7, "completion_tokens": usage_tokens, "total_tokens": 7 + usage_tokens}
    out += _event({**envelope, "choices": [], "usage": usage})
    return out + b"data: [DONE]\n\n"


def completion_stream(texts: list[str]) -> bytes:
    def chunk(text: str, finish=None) -> bytes:
        return _event({"id": "t", "object": "text_completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]})

    out = b"".join(chunk(t) for t in texts) + chunk("", "stop")
    return out + _event({"id": "t", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}) + b"data: [DONE]\n\n"


TEXTS = ["Hello", " wor", "ld", ' "quoted"', "", '""', "content\\\":\\\"", " \u00e9t\u00e9", "\n"]
WITH_TEXT = sum(1 for t in TEXTS if t)


def _feed(stream: bytes, cuts: list[int], chat: bool) -> RequestTiming:
    record = RequestTiming("m", 0.0)
    counter = SseCounter(record, chat)
    edges = [0, *sorted(cuts), len(stream)]
    for number, (start, end) in enumerate(itertools.pairwise(edges)):
        counter.feed(stream[start:end], float(number))
    assert counter.done
    return record


@pytest.mark.parametrize("split", ["whole", "bytewise", "random"])
def test_chat_stream_counts_text_chunks_in_any_split(split):
    stream = chat_stream(TEXTS, usage_tokens=12)
    cuts = {"whole": [], "bytewise": list(range(1, len(stream))),
            "random": random.Random(4).sample(range(1, len(stream)), 40)}[split]
    record = _feed(stream, cuts, chat=True)
    assert len(record.token_times) == WITH_TEXT  # not the role chunk, the empty ones or the finish chunk
    assert record.events == 1 + len(TEXTS) + 1 + 1  # role, texts, finish, usage
    assert (record.output_tokens, record.prompt_tokens) == (12, 7)
    assert record.error is None and record.end is not None


def test_timestamps_are_those_of_the_read_that_completed_each_event():
    stream = completion_stream(["a", "b", "c"])
    first_end = stream.index(b"\n\n") + 2
    # read 0: half of event 1; read 1: the rest of it and half of event 2; read 2: everything else
    record = _feed(stream, [first_end - 5, first_end + 10], chat=False)
    assert record.token_times == [1.0, 2.0, 2.0]
    assert record.end == 2.0 and record.output_tokens == 9


def test_crlf_separated_events():
    stream = completion_stream(["x", "y"]).replace(b"\n\n", b"\r\n\r\n")
    record = _feed(stream, [17, 60, 61], chat=False)
    assert len(record.token_times) == 2 and record.output_tokens == 9


def test_error_event_mid_stream_is_recorded():
    stream = completion_stream(["a"]).split(b"data: [DONE]")[0]
    stream += _event({"error": {"message": "worker crashed", "type": "server_error"}}) + b"data: [DONE]\n\n"
    record = _feed(stream, [], chat=False)
    assert record.error == "error event in the stream: worker crashed"


def test_comments_and_other_fields_are_not_events():
    stream = b": ping\n\nevent: message\ndata: " + orjson.dumps({"choices": [{"text": "hi"}]}) + b"\n\ndata: [DONE]\n\n"
    record = _feed(stream, [], chat=False)
    assert record.events == 1 and len(record.token_times) == 1


@pytest.mark.parametrize(
    ("payload", "counted"),
    [
        (b'{"choices":[{"delta":{"content":"x"}}]}', True),
        (b'{"choices":[{"delta":{"content": "\\"\\""}}]}', True),  # text made of two quotes, a space after ':'
        (b'{"choices":[{"delta":{"content":""}}]}', False),
        (b'{"choices":[{"delta":{"content":null}}]}', False),
        (b'{"choices":[{"delta":{"reasoning_content":"x","content":null}}]}', True),  # thinking tokens count
        (b'{"choices":[{"delta":{},"logprobs":{"content":[]}}]}', False),
        (b'{"choices":[{"delta":{"content":"error"}}],"usage":null}', True),
    ],
)
def test_text_is_read_from_the_named_key_only(payload, counted):
    record = _feed(b"data: " + payload + b"\n\ndata: [DONE]\n\n", [], chat=True)
    assert len(record.token_times) == int(counted)
    assert record.error is None and record.output_tokens is None


class _Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True


class _Collect:
    def __init__(self):
        self.data = b""
        self.reads = 0

    def feed(self, data: bytes, now: float) -> None:
        self.data += data
        self.reads += 1


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, at = b"", 0
    for size in [*sizes, len(body)]:
        piece = body[at : at + size]
        at += len(piece)
        if piece:
            out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


async def _post(response: bytes, cuts: list[int]) -> tuple[int, _Collect, Connection]:
    connection, sink = Connection(), _Collect()
    connection.connection_made(_Transport())
    task = asyncio.create_task(connection.post(b"POST / HTTP/1.1\r\n\r\n", sink, 5))
    await asyncio.sleep(0)
    edges = [0, *sorted(cuts), len(response)]
    for start, end in itertools.pairwise(edges):
        connection.data_received(response[start:end])
    return await task, sink, connection


@pytest.mark.parametrize("seed", range(5))
def test_chunked_body_reaches_the_sink_whole_in_any_split(seed):
    body = chat_stream(TEXTS, 12)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    response = head + _chunked(body, [100, 1, 300, 57])
    cuts = random.Random(seed).sample(range(1, len(response)), 30)
    status, sink, connection = asyncio.run(_post(response, cuts))
    assert status == 200 and sink.data == body
    assert connection.reusable


def test_one_chunk_per_read_as_servers_flush_them():
    body = completion_stream(["a", "b", "c"])
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    response = head + b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"
    cuts, at = [], len(head)
    for event in events:
        at += len(f"{len(event):x}\r\n") + len(event) + 2
        cuts.append(at)
    status, sink, _ = asyncio.run(_post(response, cuts))
    assert status == 200 and sink.data == body and sink.reads == len(events)


def test_error_status_keeps_the_body_and_connection_close_is_honoured():
    body = b'{"error": {"message": "ignore_eos: unrecognised request argument"}}'
    response = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    status, sink, connection = asyncio.run(_post(response, [30, 31]))
    assert status == 400 and sink.data == b""
    assert bytes(connection.error_body) == body
    assert not connection.reusable
