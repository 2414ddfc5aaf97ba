"""What the llamacpp engine thread does between two decodes, with the real worker: the serial part of a token.

    python -m bench.llamacpp_gap [--engine engines/smollm2-135m] [--requests 3] [--tokens 128] [--parts]

The backend is started in this process with a real `Worker` as its outputs, over a socket pair whose other end a
thread drains, as the HTTP process would. Requests run one at a time (concurrency 1, greedy, forced length).
Each `llama_decode` is timed, and the time between the end of one and the start of the next is the gap: everything
the engine thread does per step besides computing it (sampling, keeping the token, the worker's detokenising and
step frame, the next batch). With `--parts`, each part of the engine loop and of the worker's step is timed too
(the timers add a little to the gap). Prints one JSON object: per request, the prompt's decode (and the wait before
it and the gap after it) in ms, decode and gap medians in ms and µs, and each part's median and largest time in µs
(a finished sequence's state copy, `_save_retired`, is counted with its request).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson
from tokenizers import Tokenizer

from orchestrator.backends import create_backend
from orchestrator.backends.protocol import BackendSettings
from orchestrator.engine.manifest import load_manifest
from orchestrator.engine.request import EngineRequest, SamplingParams
from orchestrator.ipc.channel import HEADER, Channel
from orchestrator.ipc.messages import ROW_FINISH
from orchestrator.worker.main import Worker

ENGINE_PARTS = ("_take_inbox", "_admit", "_plan", "_rows", "_fill_batch", "_advance", "_sample", "_count",
                "_deliver", "_save_retired")


def timed(owner, name: str, into: dict[str, list[float]]) -> None:
    """Wrap `owner.name` so each call's duration is appended to `into[name]`."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            into[name].append(time.perf_counter() - started)

    setattr(owner, name, wrapper)


def drain(sock: socket.socket, finished: threading.Event) -> None:
    """Read step frames as the HTTP process would; set `finished` at each final row."""
    buffer = b""
    while data := sock.recv(1 << 20):
        buffer += data
        while len(buffer) >= HEADER.size:
            (length,) = HEADER.unpack(buffer[: HEADER.size])
            if len(buffer) < HEADER.size + length:
                break
            frame = orjson.loads(buffer[HEADER.size : HEADER.size + length])
            buffer = buffer[HEADER.size + length :]
            if any(row[ROW_FINISH] is not None for row in frame.get("outputs", ())):
                finished.set()


async def run(args: argparse.Namespace) -> dict:
    manifest = load_manifest(args.engine)
    if manifest.backend != "llamacpp":
        raise SystemExit(f"{args.engine} is a {manifest.backend} engine; this measures the llamacpp backend")
    ours, theirs = socket.socketpair()
    channel = await Channel.open(ours, any_thread=True)
    finished = threading.Event()
    threading.Thread(target=drain, args=(theirs, finished), daemon=True).start()
    tokenizer = Tokenizer.from_file(str(args.engine / "tokenizer.json"))
    backend = create_backend(BackendSettings(args.engine, manifest, manifest.kv_cache.default_budget_bytes))
    worker = Worker(channel, backend, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True), manifest.chat)
    await backend.start(worker)
    engine = backend._engine  # the engine loop: its decodes and parts are what is timed
    decodes: list[tuple[float, float]] = []
    parts: dict[str, list[float]] = defaultdict(list)
    decode = engine._ctx.decode

    def timed_decode(tokens: int) -> int:
        started = time.perf_counter()
        status = decode(tokens)
        decodes.append((started, time.perf_counter()))
        return status

    engine._ctx.decode = timed_decode
    saved, save_retired = threading.Event(), engine._save_retired

    def save_and_tell() -> None:  # the engine copies a finished sequence's state after handing its last row over
        copying = bool(engine._retired)
        save_retired()
        if copying:
            saved.set()

    engine._save_retired = save_and_tell
    if args.parts:
        for name in ENGINE_PARTS:
            timed(engine, name, parts)
        timed(worker, "step", parts)
        timed(channel, "send", parts)
    results = []
    try:
        for index in range(args.requests):
            decodes.clear()
            parts.clear()
            finished.clear()
            saved.clear()
            prompt = tuple(range(100 + index, 164 + index))  # a prompt of its own: no prefix from the last one
            submitted = time.perf_counter()
            worker._submit(EngineRequest(f"gap-{index}", prompt, args.tokens, SamplingParams(temperature=0.0),
                                         ignore_eos=True))
            await asyncio.to_thread(finished.wait)
            # its state's copy to the RAM prompt cache is counted with this request, never with the next
            if engine._ram.budget_bytes and not await asyncio.to_thread(saved.wait, 30):
                raise RuntimeError("the finished request's state was not copied to the RAM prompt cache in 30 s")
            steps = decodes[1:]  # the first decode is the prompt's
            gaps = [later[0] - earlier[1] for earlier, later in itertools.pairwise(steps)]
            results.append({
                "prompt_ms": {"wait": round((decodes[0][0] - submitted) * 1e3, 2),
                              "decode": round((decodes[0][1] - decodes[0][0]) * 1e3, 2),
                              "to_next_decode": round((decodes[1][0] - decodes[0][1]) * 1e3, 2)},
                "decode_ms_p50": round(statistics.median(end - start for start, end in steps) * 1e3, 2),
                "gap_us_p50": round(statistics.median(gaps) * 1e6),
                "gap_us_mean": round(statistics.mean(gaps) * 1e6),
                "parts_us_p50": {name: round(statistics.median(times) * 1e6)
                                 for name, times in parts.items() if times},
                "parts_us_max": {name: round(max(times) * 1e6) for name, times in parts.items() if times},
            })
    finally:
        await backend.close()
    return {"engine": str(args.engine), "tokens": args.tokens, "threads": engine._ctx.threads, "requests": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llamacpp_gap", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path("engines/smollm2-135m"))
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--parts", action="store_true", help="time each part of the loop too")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
