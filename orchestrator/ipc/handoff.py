"""Client sockets handed from the HTTP process to a worker: each as a descriptor (SCM_RIGHTS) in a packet of its
own, with the id of the request it streams, over a Unix packet socket (SOCK_SEQPACKET) beside the channel. The HTTP
process hands the socket over first, then sends the submit that names it, so the worker finds the socket
waiting. `supervisor/process.py` makes the pair; the worker inherits its end (`--handoff-fd`)."""

from __future__ import annotations

import array
import os
import socket


class Handoff:
    def __init__(self, sock: socket.socket):
        self._sock = sock
        sock.setblocking(False)  # never wait: a full or empty socket is an answer

    def give(self, request_id: str, fd: int) -> bool:
        """Send a copy of `fd` for `request_id`; False if the worker's end is full or gone."""
        try:
            return socket.send_fds(self._sock, [request_id.encode()], [fd]) > 0
        except OSError:
            return False

    def take(self, request_id: str) -> int | None:
        """The socket given for `request_id` (the caller owns it); any given before it were never claimed (their
        attach did not come) and are closed. None if it is not there."""
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(1024, socket.CMSG_LEN(array.array("i").itemsize),
                                                           socket.MSG_CMSG_CLOEXEC)
            except OSError:
                return None
            if not data:
                return None
            fds = [fd for *_, fd_bytes in ancillary for fd in array.array("i", fd_bytes)]
            if fds and data == request_id.encode():
                return fds[0]
            for fd in fds:
                os.close(fd)

    def close(self) -> None:
        self._sock.close()
