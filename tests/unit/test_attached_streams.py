"""A stream attached to its worker (ipc/messages.py's Submit with `attach`, worker/direct.py): the worker writes the
response's head with the first text and plain text chunks after it to the client's socket itself, and sends the
server only the rest, in an order the server can write after it, saying whether it wrote anything."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import orjson
import pytest
from tokenizers import Tokenizer

from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import ShuttingDown, to_wire
from orchestrator.ipc.handoff import Handoff
from orchestrator.ipc.messages import Cancel, Submit, TextDelta, decode_from_worker
from orchestrator.worker.direct import DirectStream
from orchestrator.worker.main import Worker

HEAD = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nfirst\n\r\n'  # headers, then the first events
PREFIX, SUFFIX = 'data: {"text":', "}\n\n"


@pytest.fixture(scope="module")
def tokenizer(default_engine) -> Tokenizer:
    return Tokenizer.from_file(str(default_engine / "tokenizer.json"))


class Backend:
    def submit(self, request):
        pass

    def cancel(self, request_id):
        pass


class Frames:
    def __init__(self):
        self.frames: list[dict] = []

    def send(self, frame):
        self.frames.append(frame)

    def rows(self) -> list[TextDelta]:
        return [TextDelta.from_wire(row) for frame in self.frames for row in decode_from_worker(frame).rows]


@pytest.fixture
def client():
    """The client's end and the server's end of a connection."""
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.fixture
def handoff():
    ours, theirs = (Handoff(end) for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.fixture
def worker(tokenizer, handoff, client) -> Worker:
    """A worker running request "r", whose client's socket came with its submit, as the server sends them: the
    socket over the handoff, then the frame."""
    worker = Worker(Frames(), Backend(), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True),
                    handoff=handoff[1])
    assert handoff[0].give("r", client[1].fileno())
    worker._handle(Submit(EngineRequest("r", (1,), 500), (HEAD, PREFIX, SUFFIX)).to_wire())
    return worker


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tokens(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def chunks(data: bytes) -> list[bytes]:
    """The events of HTTP/1.1 chunks, after the head (which must lead them)."""
    assert data.startswith(HEAD.encode())
    data, out = data[len(HEAD):], []
    while data:
        size, _, rest = data.partition(b"\r\n")
        length = int(size, 16)
        out.append(rest[:length])
        data = rest[length + 2 :]
    return out


def drained(sock: socket.socket) -> bytes:
    """Everything waiting in `sock`, without waiting for more."""
    sock.setblocking(False)
    received = b""
    while True:
        try:
            received += sock.recv(1 << 20)
        except BlockingIOError:
            return received


def test_an_attached_stream_writes_its_head_with_the_first_text_and_sends_only_the_finish(tokenizer, worker, client):
    """Every token counted, and the first token's time, go with the finish: the server saw nothing before it."""
    ours, _ = client
    held = open_fds()
    words = [" Paris", " is", " lovely", " in", " spring"]
    before = time.monotonic()
    for word in words:
        worker.step([TokenDelta("r", tokens(tokenizer, word))])
    assert worker._channel.rows() == [] and open_fds() == held
    worker.step([TokenDelta("r", tokens(tokenizer, "."), FinishReason.LENGTH)])
    [finish] = worker._channel.rows()
    assert (finish.text, finish.num_tokens, finish.finish, finish.tail) == (".", len(words) + 1, FinishReason.LENGTH, "")
    assert before <= finish.first_token <= time.monotonic()
    assert chunks(ours.recv(65536)) == [f'{PREFIX}"{word}"{SUFFIX}'.encode() for word in words]
    assert open_fds() == held - 1  # the worker let its copy of the socket go with the finish


def test_the_prompts_cached_tokens_with_the_first_text_are_told_with_the_finish(tokenizer, worker, client):
    """An engine says how much of the prompt its prefix cache served with the first step: that text is written like
    any other, and the count goes to the server with the finish (its usage reports it)."""
    ours, _ = client
    worker.step([TokenDelta("r", tokens(tokenizer, " Hello"), cached_tokens=64)])
    worker.step([TokenDelta("r", tokens(tokenizer, " there"))])
    worker.step([TokenDelta("r", [], FinishReason.STOP)])
    [finish] = worker._channel.rows()
    assert (finish.num_tokens, finish.cached_tokens, finish.tail) == (2, 64, "")
    assert chunks(drained(ours)) == [f'{PREFIX}"{word}"{SUFFIX}'.encode() for word in (" Hello", " there")]


def test_a_request_whose_first_row_is_its_finish_goes_back_as_it_came_with_nothing_written(tokenizer, worker, client):
    """Nothing written: the row has no tail, so the server answers as if no socket had come (its own head)."""
    ours, _ = client
    held = open_fds()
    worker.step([TokenDelta("r", tokens(tokenizer, " Hi"), FinishReason.STOP)])
    [row] = worker._channel.rows()
    assert (row.text, row.num_tokens, row.finish, row.tail, row.first_token) == (" Hi", 1, FinishReason.STOP, None,
                                                                                None)
    assert open_fds() == held - 1 and "r" not in worker._live and drained(ours) == b""


def test_an_engine_that_stops_fails_a_stream_after_what_its_worker_wrote(tokenizer, worker, client):
    """The engine dies mid-stream: the failure goes to the server with the tokens written and a tail, so the server
    ends the stream with an error event after them instead of answering afresh."""
    ours, _ = client
    worker.step([TokenDelta("r", tokens(tokenizer, " one"))])
    worker.dead("its thread raised")
    [row] = worker._channel.rows()
    assert (row.finish, row.num_tokens, row.tail) == (FinishReason.ERROR, 1, "") and row.first_token is not None
    assert chunks(drained(ours)) == [f'{PREFIX}" one"{SUFFIX}'.encode()]


def test_a_request_the_server_ends_with_an_error_ends_after_what_its_worker_wrote(tokenizer, worker, client):
    """The drain's deadline: the server cannot know what the worker wrote, so the worker sends the failure (with
    the tokens it wrote and a tail) and lets the socket go; the engine's later words for it are dropped."""
    ours, _ = client
    held = open_fds()
    worker.step([TokenDelta("r", tokens(tokenizer, " one"))])
    error = to_wire(ShuttingDown("the drain deadline ended this request"))
    worker._handle(Cancel("r", error).to_wire())
    worker.step([TokenDelta("r", [], FinishReason.CANCELLED)])
    [row] = worker._channel.rows()
    assert (row.finish, row.error, row.num_tokens, row.tail) == (FinishReason.ERROR, error, 1, "")
    assert "r" not in worker._live and open_fds() == held - 1
    assert chunks(drained(ours)) == [f'{PREFIX}" one"{SUFFIX}'.encode()]


def test_an_error_before_any_text_goes_back_as_it_came(tokenizer, worker, client):
    ours, _ = client
    worker.dead("its thread raised")
    [row] = worker._channel.rows()
    assert (row.finish, row.num_tokens, row.tail, row.first_token) == (FinishReason.ERROR, 0, None, None)
    assert drained(ours) == b""


def test_a_socket_handed_over_for_a_submit_that_never_came_is_closed_by_the_next(tokenizer, worker, handoff, client):
    _, theirs = client
    held = open_fds()
    assert handoff[0].give("other", theirs.fileno())  # its submit frame never arrives
    assert handoff[0].give("s", theirs.fileno())
    worker._handle(Submit(EngineRequest("s", (1,), 500), (HEAD, PREFIX, SUFFIX)).to_wire())
    assert worker._live["s"].direct is not None and open_fds() == held + 1  # "other"'s copy closed, "s"'s kept
    assert handoff[1].take("s") is None  # nothing else is waiting


def test_a_submit_the_worker_refuses_lets_its_socket_go(tokenizer, worker, handoff, client):
    held = open_fds()
    assert handoff[0].give("bad", client[1].fileno())
    worker._handle(Submit(EngineRequest("bad", (10**9,), 500), (HEAD, PREFIX, SUFFIX)).to_wire())  # out of range
    assert "bad" not in worker._live and worker._channel.rows()[-1].finish is FinishReason.ERROR
    assert open_fds() == held


def test_a_chunk_the_socket_does_not_take_whole_goes_back_as_the_rows_tail(tokenizer, worker, handoff, client):
    """A client that reads nothing: the socket fills, the rest of the chunk and the tokens written so far go to
    the server in one row, and every later row goes to the server too."""
    ours, theirs = client
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    word = tokens(tokenizer, " " + "x" * 200)
    steps = 0
    while not worker._channel.rows():
        worker.step([TokenDelta("r", word)])
        steps += 1
        assert steps < 10_000
    worker.step([TokenDelta("r", tokens(tokenizer, " after"))])
    handed_back, after = worker._channel.rows()
    assert handed_back.text == "" and handed_back.tail and handed_back.num_tokens == steps * len(word)
    assert after.text == " after" and after.tail is None and worker._live["r"].direct is None
    received = drained(ours)
    whole = received + handed_back.tail.encode("latin-1")  # what the client got, then what the server writes next
    assert chunks(whole) == [f'{PREFIX}"{" " + "x" * 200}"{SUFFIX}'.encode()] * steps


def test_token_by_token_the_chunks_hold_whole_characters_and_together_the_whole_text(
        tokenizer, worker, handoff, client):
    """One token per step, as engines deliver them: the first a character's first bytes (counted; the head waits
    for text), characters cut across tokens, a special token, characters JSON must escape, and a lone lead byte
    that no token completes. Each chunk is whole characters (a cut one waits for the token that completes it, a
    broken one is U+FFFD), the chunks together are the text of every token, and the server gets only the finish,
    with every token counted."""
    ours, _ = client
    text = '🎉 Café "quoted" \\ back\nnaïve 日本語\t\x01 end 👩‍👩‍👧'
    ids = tokens(tokenizer, text)
    assert tokenizer.decode(ids[:1]) != text[:1]  # the first token is not a whole character
    ids.insert(len(ids) // 2, tokenizer.token_to_id("<|im_end|>"))  # a special token: counted, no text
    ids += [tokenizer.token_to_id("ð"), *tokens(tokenizer, " after")]  # the byte 0xF0, then whole words
    worker.step([TokenDelta("r", ids[:1])])
    assert drained(ours) == b""  # no text yet: the head waits
    for token in ids[1:]:
        worker.step([TokenDelta("r", [token])])
    worker.step([TokenDelta("r", [], FinishReason.STOP)])
    assert [(row.num_tokens, row.finish) for row in worker._channel.rows()] == [(len(ids), FinishReason.STOP)]
    bodies = [orjson.loads(chunk[len(PREFIX):-len(SUFFIX)]) for chunk in chunks(drained(ours))]
    assert "".join(bodies) == tokenizer.decode(ids) == text + "\ufffd after"
    assert len(bodies) < len(ids) and all(body for body in bodies)


def test_a_single_token_chunk_the_socket_does_not_take_whole_goes_back_as_the_rows_tail(
        tokenizer, worker, handoff, client):
    ours, theirs = client
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    word = tokens(tokenizer, " hello")
    assert len(word) == 1
    steps = 0
    while not worker._channel.rows():
        worker.step([TokenDelta("r", word)])
        steps += 1
        assert steps < 100_000
    handed_back = worker._channel.rows()[0]
    assert handed_back.tail and handed_back.num_tokens == steps and worker._live["r"].direct is None
    received = drained(ours)
    assert chunks(received + handed_back.tail.encode("latin-1")) == [f'{PREFIX}" hello"{SUFFIX}'.encode()] * steps


def test_a_burst_of_frames_lets_a_waiting_step_go_between_them(default_engine):
    """Frames already buffered are read without the loop turning (a wave of submits and attaches: ~100 µs each);
    the worker yields after each, so a step handed over meanwhile is written within one frame, not after the wave."""
    from tokenizers import Tokenizer

    from orchestrator.backends.protocol import BackendStats
    from orchestrator.ipc.channel import Channel
    from orchestrator.ipc.messages import Shutdown, StatsQuery
    from orchestrator.worker.main import Worker

    order: list[str] = []

    class Engine:
        def stats(self) -> BackendStats:
            if not order:  # the engine's thread hands a step over while the first frame is handled
                asyncio.get_running_loop().call_soon(order.append, "step")
            order.append("frame")
            return BackendStats(0, 0, 1, 1, 0, 16, 0)

    async def go():
        server_end, worker_end = socket.socketpair()
        server, channel = await Channel.open(server_end), await Channel.open(worker_end)
        tokenizer = Tokenizer.from_file(str(default_engine / "tokenizer.json"))
        worker = Worker(channel, Engine(), tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
        for seq in range(3):
            server.send(StatsQuery(seq).to_wire())
        server.send(Shutdown().to_wire())
        await server.drain(force=True)  # all four frames wait in the worker's socket
        await asyncio.wait_for(worker.serve(), 10)

    asyncio.run(go())
    assert order == ["frame", "step", "frame", "frame"]


def test_a_chunk_whose_json_holds_percent_signs_is_framed_byte_for_byte(client):
    """The chunk's bytes around its text become one %-template: a % in them (a model's name, say) stays itself."""
    ours, theirs = client
    prefix, suffix = b'data: {"model":"100%-llama","text":', b',"note":"%s %d %%"}\n\n'
    stream = DirectStream(os.dup(theirs.fileno()), b"HEAD", prefix, suffix)
    for body in (b'"a"', b'"50%"', b'"%b"'):
        assert stream.pass_token("r", body) is None
    event = [prefix + body + suffix for body in (b'"a"', b'"50%"', b'"%b"')]
    assert drained(ours) == b"HEAD" + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in event)
    stream.close()
