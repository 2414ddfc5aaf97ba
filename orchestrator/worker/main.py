"""A model's worker process: owns one engine, drives its backend, speaks to the HTTP process over IPC.

    python -m orchestrator.worker --fd N [--handoff-fd M] [--preload hf,trtllm] [--log-level info]

It starts without a model: it imports the backends' runtimes (`--preload`), says "idle", and waits for a
"load" message naming the engine (every message, both ways: ipc/messages.py). The server keeps one such
spare ready, so loading a model costs only the engine's own load, not starting Python and importing torch.

A model is unloaded by ending this process (its memory, host and device, goes back with it), or, where the
backend returns all of its engine's memory when closed (`LoadReport.reusable`), by a "release": the engine
is closed and the worker says "idle" again, a spare with its runtimes imported, once its resident memory is
back within `RELEASE_SLACK_BYTES` of what it held before its first load (else it exits). If the HTTP process
goes away the channel closes and the worker exits on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
from pathlib import Path

import psutil
from tokenizers import Tokenizer

from orchestrator import aio
from orchestrator.backends import create_backend, preload_backends
from orchestrator.backends.protocol import Backend, BackendSettings
from orchestrator.engine.manifest import ChatFormat, load_manifest
from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta, check_request
from orchestrator.errors import EngineDead, EngineError, InfernoError, OutOfMemory, without_paths
from orchestrator.ipc.channel import Channel, ChannelClosed
from orchestrator.ipc.handoff import Handoff
from orchestrator.ipc.messages import (
    ROW_FINISH,
    Cancel,
    Idle,
    LoadFailed,
    LoadSpec,
    MalformedFrame,
    Release,
    Shutdown,
    StatsQuery,
    StatsReport,
    Step,
    Submit,
    TextDelta,
    WorkerReady,
    decode_to_worker,
)
from orchestrator.structured.tool_formats import tool_format
from orchestrator.text.byte_level import ByteLevelPieces
from orchestrator.worker.channels import OutputChannels
from orchestrator.worker.direct import DirectStream
from orchestrator.worker.outputs import SequenceOutput, TokenTexts

log = logging.getLogger("inferno.worker")
EXIT_ENGINE_DEAD = 3  # the engine stopped for good; the server loads the model afresh
RELEASED = -1  # serving ended by a release: the worker may load another model
RELEASE_SLACK_BYTES = 256 * 2**20  # resident memory a released worker may keep above its first "idle"


class Worker:
    """Serves one loaded engine: requests in from the HTTP process, one step frame out per engine step.

    It is the backend's `EngineOutputs`: the backend calls `step` with every request's new tokens of an engine
    step, and the worker turns them into text (detokenising, stop strings) and sends one frame. `step` may be
    called from the engine's own thread (`any_thread`): a backend whose engine runs on a thread sends each step's
    frame from there, without waking this event loop (one wake-up fewer per token where one stream runs)."""

    any_thread = True

    def __init__(self, channel: Channel, backend: Backend, tokenizer: Tokenizer, vocab_size: int,
                 chat_format: ChatFormat | None = None, handoff: Handoff | None = None):
        self._channel = channel
        self._handoff = handoff  # client sockets, for attached streams
        self._chat_format = chat_format or ChatFormat()
        self._backend = backend
        self._tokenizer = tokenizer
        self._texts = TokenTexts(tokenizer)
        self._pieces = ByteLevelPieces(tokenizer) if ByteLevelPieces.serves(tokenizer) else None
        self._vocab_size = vocab_size
        self._live: dict[str, SequenceOutput] = {}
        self._stepping = threading.Lock()  # one step (or failure of all) at a time, from whichever thread
        self.engine_dead = asyncio.Event()
        self.released = False  # the server asked for a release, not a shutdown

    async def serve(self) -> None:
        """Handle messages until the HTTP process asks to shut down, goes away, or the engine dies."""
        messages = asyncio.create_task(self._handle_messages())  # one task for every frame, not one per frame
        dead = asyncio.create_task(self.engine_dead.wait())
        try:
            await asyncio.wait([messages, dead], return_when=asyncio.FIRST_COMPLETED)
            if dead.done():  # what the worker has to say about the engine's death goes out first
                messages.cancel()
                await self._channel.drain(force=True)
            else:
                messages.result()
        finally:
            dead.cancel()
            messages.cancel()
            if self._handoff is not None:
                self._handoff.take("")  # close sockets handed over for submits that never came

    async def _handle_messages(self) -> None:
        while True:
            try:
                frame = await self._channel.recv()
            except ChannelClosed:
                return
            if self.engine_dead.is_set() or not self._handle(frame):
                return
            await asyncio.sleep(0)  # a step waiting to be written goes first: frames come in waves of requests

    def _handle(self, frame: dict) -> bool:
        """Act on one frame from the server; False once it asks to shut down. A malformed frame is logged and
        otherwise left alone, except a submit whose request id can be read: that request fails."""
        try:
            message = decode_to_worker(frame)
        except MalformedFrame as exc:
            log.error("the server sent a malformed frame: %s", exc)
            if exc.request_id is not None:
                self._refuse(exc.request_id, EngineError(f"the engine refused the request: {exc}"))
            return True
        if type(message) is Submit:
            self._submit(message.request, message.attach)
        elif type(message) is Cancel:
            self._cancel(message.request_id, message.error)
        elif type(message) is StatsQuery:
            self._channel.send(StatsReport(message.seq, self._backend.stats()).to_wire())
        elif type(message) is Shutdown:
            return False
        elif type(message) is Release:
            self.released = True
            self._fail_live(EngineError("the model was unloaded while this request ran"))
            return False
        else:
            log.error("the server sent a '%s' frame to a loaded worker; ignoring it", message.KIND)
        return True

    def _submit(self, request: EngineRequest, attach: tuple[str, str, str] | None = None) -> None:
        """Check the request and hand it to the backend; a refusal fails that request alone. With `attach`, its
        client's socket is waiting in the handoff: the worker writes the stream's plain text (DirectStream)."""
        fd = self._handoff.take(request.id) if attach is not None and self._handoff is not None else None
        direct = DirectStream(fd, *(part.encode("latin-1") for part in attach)) if fd is not None else None
        try:
            check_request(request, self._vocab_size)
            output = SequenceOutput(request, self._tokenizer, self._texts, self._channels(request), self._pieces)
            output.direct = direct
            self._live[request.id] = output
            self._backend.submit(request)  # its engine thread may deliver at once
        except Exception as exc:
            self._live.pop(request.id, None)
            if direct is not None:
                direct.close()
            error = exc if isinstance(exc, InfernoError) else EngineError(f"the engine refused the request: {exc}")
            if not isinstance(exc, InfernoError):
                log.exception("submitting request %s failed", request.id)
            self._refuse(request.id, error)

    def _refuse(self, request_id: str, error: InfernoError) -> None:
        self._send([TextDelta.failure(request_id, error).to_wire()])

    def _channels(self, request: EngineRequest) -> OutputChannels | None:
        """Content, thinking and tool calls apart, for requests that ask (others' text is all content)."""
        if not request.tool_calls and not request.reasoning:
            return None
        fmt = tool_format(self._chat_format.tool_call_format)
        return OutputChannels(request, fmt, self._chat_format.reasoning_format)

    def _cancel(self, request_id: str, error: dict | None = None) -> None:
        """Stop the request in the engine; with `error`, end it here with that error (its last row, after what
        was written to the client here: DirectStream.pass_on)."""
        if request_id not in self._live:
            return
        self._backend.cancel(request_id)
        if error is not None:
            with self._stepping:
                output = self._live.pop(request_id)
                row = TextDelta(request_id, "", 0, FinishReason.ERROR, error).to_wire()
                self._send([row if output.direct is None else output.direct.pass_on(request_id, row)])

    # -- EngineOutputs: called by the backend on this event loop --------------------------------------------------
    def step(self, deltas: list[TokenDelta]) -> None:
        rows = []
        live = self._live
        with self._stepping:
            for delta in deltas:
                output = live.get(delta.request_id)
                if output is None:
                    continue  # ended here already (a stop string, a repeated call): its late words are not needed
                direct = output.direct
                if direct is not None and (body := output.json(delta)):
                    row = direct.pass_token(output.request_id, body)  # the usual token: no row made
                else:
                    row = output.row(delta)
                    if row is None:
                        continue
                    if direct is not None:
                        row = direct.pass_on(output.request_id, row)
                if row is None:
                    continue
                if direct is not None and direct.ended:  # it ends only with a row to send
                    output.direct = None
                rows.append(row)
                if row[ROW_FINISH] is not None:
                    del live[delta.request_id]
                    if delta.finish is None:  # a stop string or a repeated call ended it: free its engine place
                        self._backend.cancel(delta.request_id)
            if rows:
                self._send(rows)

    def dead(self, reason: str) -> None:
        log.error("the engine stopped: %s; exiting so the model is loaded afresh", reason)
        self._fail_live(EngineDead(f"the engine stopped: {reason}"))
        self.engine_dead.set()

    def _fail_live(self, error: InfernoError) -> None:
        with self._stepping:
            rows = []
            for request_id, output in self._live.items():
                row = TextDelta.failure(request_id, error).to_wire()
                rows.append(row if output.direct is None else output.direct.pass_on(request_id, row))
            self._live.clear()
            if rows:
                self._send(rows)

    def _send(self, rows: list[list]) -> None:
        try:
            self._channel.send(Step(rows).to_wire())
        except ChannelClosed:
            pass


def _classify_load_error(exc: Exception, folder: Path) -> InfernoError:
    """What the server (and /ready, and the clients waiting) are told: the engine folder by its name only."""
    if isinstance(exc, InfernoError):
        exc.message = without_paths(exc.message, folder)
        return exc
    text = without_paths(str(exc), folder)
    if "out of memory" in text.lower():
        return OutOfMemory(f"not enough device memory to load this model: {text}")
    return EngineError(f"loading the engine failed: {type(exc).__name__}: {text}")


async def _exit_when_parent_leaves(channel: Channel) -> None:
    """During the load nobody else reads the channel: a closed channel means the server is gone."""
    try:
        await channel.recv()
    except ChannelClosed:
        pass
    os._exit(1)


async def _receive_load(channel: Channel) -> LoadSpec | None:
    """The load message; None if the server asks this worker to shut down first. MalformedFrame for any other
    frame, ChannelClosed if the server goes away."""
    message = decode_to_worker(await channel.recv())
    if isinstance(message, Shutdown):
        return None
    if not isinstance(message, LoadSpec):
        raise MalformedFrame(f"a '{message.KIND}' frame came before the load")
    return message


async def _fail_load(channel: Channel, error: InfernoError) -> int:
    channel.send(LoadFailed(error).to_wire())
    await channel.drain()
    return 1


async def main_async(fd: int, preload: tuple[str, ...], handoff_fd: int | None = None) -> int:
    channel = await Channel.open(socket.socket(fileno=fd), any_thread=True)
    handoff = Handoff(socket.socket(fileno=handoff_fd)) if handoff_fd is not None else None
    preload_backends(preload)
    aio.settle_heap()
    baseline = psutil.Process().memory_info().rss
    while True:
        channel.send(Idle(os.getpid()).to_wire())
        try:
            spec = await _receive_load(channel)
        except ChannelClosed:
            return 0
        except MalformedFrame as exc:
            log.error("the server sent a malformed load: %s", exc)
            return await _fail_load(channel, EngineError(f"the worker could not read its load message: {exc}"))
        if spec is None:
            return 0
        code = await _serve(channel, spec, handoff)
        if code != RELEASED or not _memory_back(baseline):
            return 0 if code == RELEASED else code
        _name_the_log("spare")


async def _serve(channel: Channel, spec: LoadSpec, handoff: Handoff | None = None) -> int:
    """Load the engine, serve it until told to stop, close it; the exit code, or RELEASED."""
    folder = Path(spec.engine_dir)
    _name_the_log(folder.name)
    watchdog = asyncio.create_task(_exit_when_parent_leaves(channel))
    try:
        manifest = load_manifest(folder)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        backend = create_backend(BackendSettings(folder, manifest, spec.kv_cache_bytes, spec.options, spec.weights_kept))
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        worker = Worker(channel, backend, tokenizer, vocab_size, manifest.chat, handoff)
        report = await backend.start(worker)
    except Exception as exc:
        error = _classify_load_error(exc, folder)
        log.error("%s: %s", folder.name, error.message)
        return await _fail_load(channel, error)
    watchdog.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watchdog  # the channel has one reader at a time
    aio.reclaim_heap()
    channel.send(WorkerReady(os.getpid(), psutil.Process().memory_info().rss, report).to_wire())
    try:
        await worker.serve()
    finally:
        await backend.close()
    if worker.engine_dead.is_set():
        return EXIT_ENGINE_DEAD
    return RELEASED if worker.released and report.reusable else 0


def _memory_back(baseline: int) -> bool:
    """After a release: reclaim the closed engine's memory and say whether the process holds no more than it did
    before its first load (+ slack)."""
    aio.reclaim_heap()
    rss = psutil.Process().memory_info().rss
    if rss <= baseline + RELEASE_SLACK_BYTES:
        log.info("released: %.0f MiB resident (%.0f MiB before the first load); a spare again",
                 rss / 2**20, baseline / 2**20)
        return True
    log.warning("released, but %.0f MiB resident (%.0f MiB before the first load): exiting instead",
                rss / 2**20, baseline / 2**20)
    return False


def _name_the_log(model: str) -> None:
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s worker[{model}] %(name)s: %(message)s"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.worker")
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket to the server")
    parser.add_argument("--handoff-fd", type=int, help="the inherited socket client sockets come over")
    parser.add_argument("--preload", default="", help="backends whose runtime to import before any load")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s worker[spare] %(name)s: %(message)s"
    )
    preload = tuple(name for name in args.preload.split(",") if name)
    code = aio.run(main_async(args.fd, preload, args.handoff_fd))
    # The engine is closed and its results delivered: skip the interpreter's teardown of torch and CUDA
    # (seconds, for nothing); the process's memory, host and device, is returned as it exits.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
