"""The grammar check before admission: every guide is compiled once, with a time limit, over the model's
real vocabulary, before its request may take a permit.

TensorRT-LLM's guided decoder compiles a request's grammar inside the engine loop, and a grammar that fails
there fails every request of the model; a pathological one stalls them all. So the HTTP process checks
each guide first, in a separate long-lived process (`checker_process.py`, spawned on first use: xgrammar
imports torch and transformers, which the HTTP process never does). A compile that exceeds the time limit
kills that process; the next check starts a fresh one, so one grammar never blocks the others for longer
than the limit. Outcomes, good and bad, are remembered by content (bounded, least recently used first
out), so a repeated guide answers without a round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import json
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InvalidRequest, ModelUnavailable, UnsupportedParameter
from orchestrator.structured.guide import Guide

INSTALL_HINT = "pip install --no-deps xgrammar==0.1.25 (it needs torch, transformers, numpy, pydantic, ninja)"


@dataclass(frozen=True)
class _VocabRef:
    key: str  # identity of (folder, tokenizer.json version, stop ids, logits width)
    folder: str
    stop_token_ids: tuple[int, ...] | None
    size: int | None


@dataclass(frozen=True)
class _Outcome:
    """What checking one guide over one vocabulary said: ok, refused (with xgrammar's reason), too slow,
    or the checker process died compiling it."""

    verdict: str  # "ok" | "refused" | "slow" | "crashed"
    reason: str = ""


class _CheckerGone(Exception):
    """The checker process closed its end (it died)."""


class GrammarChecker:
    """Checks guides in a child process. One compile runs at a time; `time_limit_s` bounds each compile,
    `start_time_limit_s` bounds starting the process and reading a model's vocabulary."""

    def __init__(
        self,
        *,
        time_limit_s: float = 10.0,
        start_time_limit_s: float = 120.0,
        cache_entries: int = 4096,
        threads: int = 1,
        python: str = sys.executable,
    ):
        self.time_limit_s = time_limit_s
        self.start_time_limit_s = start_time_limit_s
        self._cache_entries = cache_entries
        self._command = [python, "-m", "orchestrator.structured.grammar.checker_process", "--threads", str(threads)]
        self._outcomes: OrderedDict[str, _Outcome] = OrderedDict()
        self._inflight: dict[str, asyncio.Task] = {}
        self._lock = asyncio.Lock()
        self._process: asyncio.subprocess.Process | None = None
        self._loaded: set[str] = set()  # vocabularies the current process has read
        self._unavailable: str | None = None
        self.xgrammar_version: str | None = None
        self.round_trips = 0  # compile requests sent to a process
        self.restarts = 0  # processes killed for a time limit or found dead

    async def start(self) -> None:
        """Start the process now rather than on the first check (it takes seconds to import xgrammar)."""
        async with self._lock:
            await self._ensure_started()

    async def check(
        self,
        folder: Path,
        guide: Guide,
        *,
        stop_token_ids: tuple[int, ...] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """Return if `guide` compiles over the vocabulary of engine folder `folder`; raise InvalidRequest
        quoting xgrammar's reason if it does not, or saying it took longer than the time limit. Raises
        UnsupportedParameter when xgrammar is not installed, ModelUnavailable when the checker cannot
        start or read the vocabulary."""
        vocab = _vocab_ref(folder, stop_token_ids, vocab_size)
        key = _outcome_key(vocab, guide)
        outcome = self._outcomes.get(key)
        if outcome is not None:
            self._outcomes.move_to_end(key)
        else:
            task = self._inflight.get(key)
            if task is None:
                task = asyncio.ensure_future(self._resolve(key, vocab, guide))
                self._inflight[key] = task
            # A cancelled caller leaves the check running, to finish and be remembered.
            outcome = await asyncio.shield(task)
        if outcome.verdict != "ok":
            raise InvalidRequest(self._message(guide, outcome), param=guide.param)

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        await self._kill(restart=False)

    def _message(self, guide: Guide, outcome: _Outcome) -> str:
        field = guide.param or f"the {guide.kind} constraint"
        if outcome.verdict == "refused":
            return f"{field} cannot be enforced: xgrammar refused it: {outcome.reason}"
        if outcome.verdict == "slow":
            return f"{field}: the grammar took longer than {self.time_limit_s:g} s to compile; simplify it"
        return f"{field}: the grammar checker crashed compiling this grammar ({outcome.reason})"

    async def _resolve(self, key: str, vocab: _VocabRef, guide: Guide) -> _Outcome:
        try:
            outcome = await self._compile(vocab, guide)
            self._outcomes[key] = outcome
            while len(self._outcomes) > self._cache_entries:
                self._outcomes.popitem(last=False)
            return outcome
        finally:
            self._inflight.pop(key, None)

    async def _compile(self, vocab: _VocabRef, guide: Guide) -> _Outcome:
        async with self._lock:
            await self._ensure_started()
            await self._ensure_loaded(vocab)
            kind, text = guide.compiled_form()
            self.round_trips += 1
            try:
                reply = await asyncio.wait_for(
                    self._request({"op": "compile", "vocab": vocab.key, "kind": kind, "text": text}),
                    self.time_limit_s,
                )
            except TimeoutError:
                await self._kill()
                return _Outcome("slow")
            except _CheckerGone as exc:
                await self._kill()
                return _Outcome("crashed", str(exc))
            return _Outcome("ok") if reply["ok"] else _Outcome("refused", reply["error"])

    async def _ensure_started(self) -> None:
        if self._unavailable is not None:
            raise UnsupportedParameter(self._unavailable)
        if self._process is not None and self._process.returncode is None:
            return
        if self._process is not None:
            await self._kill()
        if importlib.util.find_spec("xgrammar") is None:
            self._unavailable = f"structured outputs need the xgrammar package on the server: {INSTALL_HINT}"
            raise UnsupportedParameter(self._unavailable)
        self._process = await asyncio.create_subprocess_exec(
            *self._command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        try:
            hello = await asyncio.wait_for(self._read(), self.start_time_limit_s)
        except (TimeoutError, _CheckerGone) as exc:
            await self._kill()
            raise ModelUnavailable(f"the grammar checker did not start: {exc or 'time limit'}") from exc
        if not hello.get("ready"):
            await self._kill()
            self._unavailable = (
                f"structured outputs need xgrammar, which cannot be imported here ({hello.get('error')}): "
                f"{INSTALL_HINT}"
            )
            raise UnsupportedParameter(self._unavailable)
        self.xgrammar_version = hello.get("xgrammar")

    async def _ensure_loaded(self, vocab: _VocabRef) -> None:
        if vocab.key in self._loaded:
            return
        message = {
            "op": "load",
            "vocab": vocab.key,
            "folder": vocab.folder,
            "stop_token_ids": list(vocab.stop_token_ids) if vocab.stop_token_ids else None,
            "size": vocab.size,
        }
        try:
            reply = await asyncio.wait_for(self._request(message), self.start_time_limit_s)
        except (TimeoutError, _CheckerGone) as exc:
            await self._kill()
            raise ModelUnavailable(
                f"the grammar checker could not read the vocabulary of {vocab.folder}"
            ) from exc
        if not reply["ok"]:
            raise ModelUnavailable(
                f"the grammar checker could not read the vocabulary of {vocab.folder}: {reply['error']}"
            )
        self._loaded.add(vocab.key)

    async def _request(self, message: dict) -> dict:
        process = self._process
        assert process is not None and process.stdin is not None
        try:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _CheckerGone("its input closed") from exc
        return await self._read()

    async def _read(self) -> dict:
        assert self._process is not None and self._process.stdout is not None
        line = await self._process.stdout.readline()
        if not line:
            code = await self._process.wait()
            raise _CheckerGone(f"it exited with status {code}")
        return json.loads(line)

    async def _kill(self, *, restart: bool = True) -> None:
        """End the process; the next check starts a fresh one (counted in `restarts` unless closing)."""
        process, self._process = self._process, None
        self._loaded.clear()
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()
        self.restarts += int(restart)


def _vocab_ref(folder: Path, stop_token_ids: tuple[int, ...] | None, size: int | None) -> _VocabRef:
    folder = Path(folder).resolve()
    try:
        stat = (folder / "tokenizer.json").stat()  # a rebuilt engine folder is a new vocabulary
    except OSError as exc:
        raise ModelUnavailable(f"the grammar checker found no tokenizer.json in {folder}") from exc
    stops = tuple(stop_token_ids) if stop_token_ids else None
    key = json.dumps([str(folder), stat.st_mtime_ns, stat.st_size, stops, size])
    return _VocabRef(hashlib.sha256(key.encode()).hexdigest(), str(folder), stops, size)


def _outcome_key(vocab: _VocabRef, guide: Guide) -> str:
    digest = hashlib.sha256(f"{vocab.key}\0{guide.kind}\0".encode())
    digest.update(guide.text.encode())
    return digest.hexdigest()
