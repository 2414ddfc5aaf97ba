"""The worker's per-token path alone: `Worker.step` over attached streams on real loopback sockets, CPU per token.

    python -m bench.worker_step --engine engines/smollm2-135m [--streams 128] [--steps 400] [--tick-ms 5] [--no-send]

The same set-up as `python -m bench.socket_floor` (loopback TCP connections, a child process reading them all, one
round per `--tick-ms`), but each round is one engine step of one new token per stream, handed to the worker's own
`Worker.step`: the row (`SequenceOutput.row`, detokenising with the model's tokenizer) and the attached stream's
write (`DirectStream.pass_on`). Its user and system CPU (getrusage) per token, set beside the floor's per write,
says how much of the worker's per-token cost is Python around the `send`. `--no-send` replaces the write with
nothing, leaving the Python before it. The tokens are drawn from the first `--vocab` ids of the vocabulary, their
byte-level pieces filled in first (a serving worker's table is warm).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from tokenizers import Tokenizer

from orchestrator.bench.floor import LoopbackReader
from orchestrator.engine.request import EngineRequest, SamplingParams, TokenDelta
from orchestrator.text.byte_level import ByteLevelPieces
from orchestrator.worker.direct import DirectStream
from orchestrator.worker.main import Worker
from orchestrator.worker.outputs import SequenceOutput, TokenTexts

PREFIX = '{"id":"cmpl-0123456789abcdef","object":"text_completion","created":1764000000,"choices":[{"index":0,"text":'
SUFFIX = ',"logprobs":null,"finish_reason":null}]}\n\n'


class _Unsent(DirectStream):
    """An attached stream whose chunks are framed but never sent (--no-send)."""

    __slots__ = ()

    def __init__(self, *args):
        super().__init__(*args)
        self._send = lambda data, flags: len(data)


def measure(tokenizer: Tokenizer, streams: int, steps: int, tick_s: float, vocab: int, send: bool) -> dict:
    pieces = ByteLevelPieces(tokenizer) if ByteLevelPieces.serves(tokenizer) else None
    ids = list(range(min(vocab, tokenizer.get_vocab_size())))
    if pieces is not None:
        pieces.join(ids, True)  # warm, as a serving worker's is
    reader = LoopbackReader(streams)
    live, texts = {}, TokenTexts(tokenizer)
    for index, server in enumerate(reader.servers):
        request = EngineRequest(id=f"cmpl-{index:032x}.0", prompt_ids=(1,), max_new_tokens=steps + 1,
                                sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=index))
        output = live[request.id] = SequenceOutput(request, tokenizer, texts, None, pieces)
        output.direct = (DirectStream if send else _Unsent)(
            os.dup(server.fileno()), b"", b"data: " + PREFIX.encode(), SUFFIX.encode())  # no head: opened already
    sent = []
    worker = SimpleNamespace(_live=live, _stepping=threading.Lock(), _send=sent.extend,
                             _backend=SimpleNamespace(cancel=lambda request_id: None))
    rng = random.Random(0)
    rounds = [[TokenDelta(request_id, [rng.choice(ids)]) for request_id in live] for _ in range(steps)]
    before = resource.getrusage(resource.RUSAGE_SELF)  # to the microsecond, as the floor's
    for deltas in rounds:
        started = time.perf_counter()
        Worker.step(worker, deltas)
        time.sleep(max(0.0, tick_s - (time.perf_counter() - started)))
    after = resource.getrusage(resource.RUSAGE_SELF)
    for output in live.values():
        if output.direct is not None:
            output.direct.close()
    bytes_read = reader.close()
    tokens = streams * steps
    user, system = (after.ru_utime - before.ru_utime) / tokens * 1e6, (after.ru_stime - before.ru_stime) / tokens * 1e6
    return {"streams": streams, "steps": steps, "tokens": tokens, "send": send, "rows_sent_to_server": len(sent),
            "bytes_read": bytes_read,
            "user_us_per_token": round(user, 2), "system_us_per_token": round(system, 2),
            "us_per_token": round(user + system, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_step", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True, help="an engine folder (its tokenizer.json is used)")
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--vocab", type=int, default=3000)
    parser.add_argument("--no-send", action="store_true")
    args = parser.parse_args(argv)
    tokenizer = Tokenizer.from_file(str(args.engine / "tokenizer.json"))
    result = measure(tokenizer, args.streams, args.steps, args.tick_ms / 1e3, args.vocab, not args.no_send)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
