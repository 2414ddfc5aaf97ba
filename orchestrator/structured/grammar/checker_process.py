"""The grammar checker's own process: compiles guides with xgrammar so the HTTP process never imports it.

Started by `checker.GrammarChecker` as `python -m orchestrator.structured.grammar.checker_process --threads N`.
Protocol: one JSON object per line. On start it writes `{"ready": true, "xgrammar": version}` (or
`{"ready": false, "error": ...}` when xgrammar cannot be imported). Then, for each request line:

- `{"op": "load", "vocab": KEY, "folder": DIR, "stop_token_ids": [..] | null, "size": N | null}` reads the
  folder's vocabulary once and keeps a compiler for it under KEY;
- `{"op": "compile", "vocab": KEY, "kind": K, "text": T, "steps": S}` compiles one guide (compiled form; a
  structural tag also as its EBNF lowering) and measures its mask cost along a sample walk of S steps
  (`step_ms`: mean ms to fill one row's bitmask per step);

each answered by `{"ok": true, ...}` or `{"ok": false, "error": reason}`. Requests are handled one at a
time; the parent enforces time limits by killing this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path


def _serve(channel, threads: int) -> int:
    try:
        from orchestrator.structured.grammar.compile import (
            GrammarRefused,
            check_guide,
            mask_cost_ms,
            new_compiler,
        )
        from orchestrator.structured.vocabulary import load_vocabulary
    except Exception as exc:  # xgrammar or one of its dependencies (torch, transformers) is missing
        _send(channel, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send(channel, {"ready": True, "xgrammar": metadata.version("xgrammar")})
    compilers = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "load":
                vocabulary = load_vocabulary(Path(request["folder"]),
                                             stop_token_ids=tuple(request["stop_token_ids"] or ()) or None,
                                             size=request.get("size"))
                # The parent caches outcomes; xgrammar's own cache would only grow here.
                compilers[request["vocab"]] = new_compiler(vocabulary, threads=threads, cache=False)
                reply = {"ok": True, "vocab_size": vocabulary.size}
            else:
                started = time.perf_counter()
                compiled = check_guide(compilers[request["vocab"]], request["kind"], request["text"])
                compile_ms = round((time.perf_counter() - started) * 1000, 3)
                step_ms = mask_cost_ms(compiled, request.get("steps", 8))
                reply = {"ok": True, "compile_ms": compile_ms, "step_ms": round(step_ms, 4)}
        except GrammarRefused as exc:
            reply = {"ok": False, "error": exc.reason}
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        _send(channel, reply)
    return 0


def _send(channel, message: dict) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    # The protocol owns the original stdout; anything a library prints goes to stderr instead.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return _serve(channel, args.threads)


if __name__ == "__main__":
    sys.exit(main())
