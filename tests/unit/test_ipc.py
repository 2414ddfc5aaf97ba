"""Framing of the HTTP-process <-> worker channel."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from orchestrator.ipc.channel import (
    GATHER_S,
    HEADER,
    Channel,
    ChannelClosed,
    FrameTooLarge,
    encode_frame,
    read_frame,
)


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def test_frames_round_trip_in_order():
    async def go():
        messages = [{"kind": "step", "outputs": [["r.0", "héllo 🎉", 2, None, None]]}, {"kind": "stats", "seq": 7}]
        reader = reader_with(b"".join(encode_frame(m) for m in messages))
        return [await read_frame(reader) for _ in messages]

    assert asyncio.run(go()) == [
        {"kind": "step", "outputs": [["r.0", "héllo 🎉", 2, None, None]]},
        {"kind": "stats", "seq": 7},
    ]


def test_a_frame_arriving_in_pieces_is_reassembled():
    async def go():
        frame = encode_frame({"kind": "submit", "request": {"prompt_ids": list(range(1000))}})
        reader = asyncio.StreamReader()
        task = asyncio.create_task(read_frame(reader))
        for i in range(0, len(frame), 7):
            reader.feed_data(frame[i : i + 7])
            await asyncio.sleep(0)
        return await task

    assert asyncio.run(go())["request"]["prompt_ids"][-1] == 999


def test_end_of_stream_mid_frame_is_channel_closed():
    async def go():
        frame = encode_frame({"kind": "step", "outputs": []})
        await read_frame(reader_with(frame[:-2]))

    with pytest.raises(ChannelClosed):
        asyncio.run(go())


def test_clean_end_of_stream_is_channel_closed():
    async def go():
        await read_frame(reader_with(b""))

    with pytest.raises(ChannelClosed):
        asyncio.run(go())


def test_oversized_incoming_frame_is_refused():
    async def go():
        await read_frame(reader_with(HEADER.pack(2**31) + b"x"))

    with pytest.raises(FrameTooLarge):
        asyncio.run(go())


def test_channel_over_a_socket_pair():
    async def go():
        left, right = socket.socketpair()
        a, b = await Channel.open(left), await Channel.open(right)
        a.send({"kind": "submit", "n": 1})
        a.send({"kind": "cancel", "n": 2})
        first, second = await b.recv(), await b.recv()
        a.close()
        with pytest.raises(ChannelClosed):
            await b.recv()
        b.close()
        return first, second

    assert asyncio.run(go()) == ({"kind": "submit", "n": 1}, {"kind": "cancel", "n": 2})


def test_the_servers_frames_of_one_turn_go_in_one_write_and_none_waits_past_the_gathering_time():
    """A wave of submits wakes a worker once: what the HTTP process sends in one turn of its event loop is written
    together at the turn's end; a turn that runs longer than GATHER_S writes what it gathered then; a close sends
    what was gathered before it."""
    async def go():
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        channel = await Channel.open(ours)
        for n in range(3):
            channel.send({"kind": "submit", "n": n})
        before_the_turn_ended = _received(theirs)
        await asyncio.sleep(0)  # the turn ends
        one_write = theirs.recv(1 << 16)
        channel.send({"kind": "cancel", "n": 3})
        deadline = time.monotonic() + GATHER_S
        while time.monotonic() < deadline:  # a long turn: the loop does not turn here
            pass
        channel.send({"kind": "cancel", "n": 4})
        mid_turn = _received(theirs)
        channel.send({"kind": "shutdown"})
        channel.close()
        await asyncio.sleep(0)
        return before_the_turn_ended, one_write, mid_turn, _received(theirs)

    before, one_write, mid_turn, at_close = asyncio.run(go())
    assert before == b""
    assert one_write == b"".join(encode_frame({"kind": "submit", "n": n}) for n in range(3))
    assert mid_turn == encode_frame({"kind": "cancel", "n": 3}) + encode_frame({"kind": "cancel", "n": 4})
    assert at_close == encode_frame({"kind": "shutdown"})


def _received(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1 << 16)
    except BlockingIOError:
        return b""


def test_the_workers_channel_sends_whole_frames_in_order_from_many_threads():
    """The worker's side writes from its engine thread and its event loop at once: every frame arrives whole, and
    each thread's in the order it sent them, including frames larger than the socket holds (the sender waits)."""
    async def go():
        left, right = socket.socketpair()
        sender, receiver = await Channel.open(left, any_thread=True), await Channel.open(right)

        def send_all(thread: int) -> None:
            for seq in range(100):
                sender.send({"kind": "step", "thread": thread, "seq": seq, "pad": "x" * (seq * 7919 % 700_000)})

        threads = [threading.Thread(target=send_all, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        frames = [await asyncio.wait_for(receiver.recv(), 30) for _ in range(400)]
        for thread in threads:
            thread.join()
        sender.close()
        receiver.close()
        return frames

    frames = asyncio.run(go())
    for thread in range(4):
        mine = [f for f in frames if f["thread"] == thread]
        assert [f["seq"] for f in mine] == list(range(100))
        assert all(len(f["pad"]) == f["seq"] * 7919 % 700_000 for f in mine)


def test_the_workers_channel_waits_while_the_socket_is_full_and_fails_once_the_other_side_left():
    async def go():
        left, right = socket.socketpair()
        sender, receiver = await Channel.open(left, any_thread=True), await Channel.open(right)
        big = {"kind": "step", "pad": "y" * 8_000_000}  # far more than a socket pair buffers
        sending = threading.Thread(target=sender.send, args=(big,))
        sending.start()
        sending.join(0.3)  # a send that queued the frame and returned (as asyncio's transport does) ends here
        waited = sending.is_alive()  # nothing read yet: the sender is still waiting for room
        received = await asyncio.wait_for(receiver.recv(), 30)
        sending.join(30)
        receiver.close()
        await receiver._writer.wait_closed()  # the socket is closed once the transport has let it go
        with pytest.raises(ChannelClosed):
            for _ in range(100):  # the first writes may still fit the buffer of a socket closing
                sender.send({"kind": "step", "pad": "z" * 100_000})
        return waited, len(received["pad"]), sending.is_alive()

    assert asyncio.run(go()) == (True, 8_000_000, False)
