"""One grammar checker process, seen from the HTTP process: starting it, reading a model's vocabulary into it,
asking it to compile a guide and measure its mask cost, and killing it when a compile exceeds its time limit.

`checker.GrammarChecker` keeps a small pool of these and decides which guide goes to which; a link serves
one request at a time (its owner holds it while it works).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
from dataclasses import dataclass

from orchestrator.errors import ModelUnavailable

INSTALL_HINT = "pip install --no-deps xgrammar==0.1.25 (it needs torch, transformers, numpy, pydantic, ninja)"


@dataclass(frozen=True)
class VocabRef:
    key: str  # identity of (folder, tokenizer.json version, stop ids, logits width)
    folder: str
    stop_token_ids: tuple[int, ...] | None
    size: int | None


class CheckerGone(Exception):
    """The checker process closed its end (it died)."""


class XgrammarMissing(Exception):
    """xgrammar cannot be imported here; the message says how to install it."""


class CheckerLink:
    """One child process; `compile` returns its reply, raises TimeoutError (the process is then killed) or
    CheckerGone."""

    def __init__(self, command: list[str], start_time_limit_s: float):
        self._command = command
        self._start_time_limit_s = start_time_limit_s
        self._process: asyncio.subprocess.Process | None = None
        self._loaded: set[str] = set()  # vocabularies the current process has read
        self.xgrammar_version: str | None = None
        self.restarts = 0  # processes killed for a time limit or found dead

    async def compile(self, vocab: VocabRef, message: dict, time_limit_s: float) -> dict:
        await self.ensure_started()
        await self._ensure_loaded(vocab)
        try:
            return await asyncio.wait_for(self._request(message), time_limit_s)
        except (TimeoutError, CheckerGone):
            await self.kill()
            raise

    async def ensure_started(self) -> None:
        if self._process is not None and self._process.returncode is None:
            return
        if self._process is not None:
            await self.kill()
        if importlib.util.find_spec("xgrammar") is None:
            raise XgrammarMissing(f"structured outputs need the xgrammar package on the server: {INSTALL_HINT}")
        self._process = await asyncio.create_subprocess_exec(
            *self._command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        try:
            hello = await asyncio.wait_for(self._read(), self._start_time_limit_s)
        except (TimeoutError, CheckerGone) as exc:
            await self.kill()
            raise ModelUnavailable(f"the grammar checker did not start: {exc or 'time limit'}") from exc
        if not hello.get("ready"):
            await self.kill()
            raise XgrammarMissing(
                f"structured outputs need xgrammar, which cannot be imported here ({hello.get('error')}): "
                f"{INSTALL_HINT}"
            )
        self.xgrammar_version = hello.get("xgrammar")

    async def _ensure_loaded(self, vocab: VocabRef) -> None:
        if vocab.key in self._loaded:
            return
        message = {"op": "load", "vocab": vocab.key, "folder": vocab.folder,
                   "stop_token_ids": list(vocab.stop_token_ids) if vocab.stop_token_ids else None,
                   "size": vocab.size}
        try:
            reply = await asyncio.wait_for(self._request(message), self._start_time_limit_s)
        except (TimeoutError, CheckerGone) as exc:
            await self.kill()
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
            raise CheckerGone("its input closed") from exc
        return await self._read()

    async def _read(self) -> dict:
        assert self._process is not None and self._process.stdout is not None
        line = await self._process.stdout.readline()
        if not line:
            code = await self._process.wait()
            raise CheckerGone(f"it exited with status {code}")
        return json.loads(line)

    async def kill(self, *, restart: bool = True) -> None:
        """End the process; the next request starts a fresh one (counted in `restarts` unless closing)."""
        process, self._process = self._process, None
        self._loaded.clear()
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()
        self.restarts += int(restart)
