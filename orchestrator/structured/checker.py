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
import json
import sys
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InvalidRequest, ModelUnavailable, UnsupportedParameter
from orchestrator.structured.checker_link import CheckerGone, CheckerLink, VocabRef, XgrammarMissing
from orchestrator.structured.guide import Guide
from orchestrator.structured.guide_limits import check_structure


@dataclass(frozen=True)
class _Outcome:
    """What checking one guide over one vocabulary said: ok, refused (with xgrammar's reason), too slow,
    or the checker process died compiling it."""

    verdict: str  # "ok" | "refused" | "slow" | "crashed"
    reason: str = ""
    step_ms: float = 0.0  # one row's mask cost per decoding step, when ok

    @property
    def definite(self) -> bool:
        """A verdict about the guide itself, not about the checker's load: worth remembering."""
        return self.verdict in ("ok", "refused")


class GrammarChecker:
    """Checks guides in a pool of `processes` child processes, at most `per_key` at a time for one key.
    `time_limit_s` bounds each compile, `start_time_limit_s` starting a process and reading a model's
    vocabulary, `wait_s` a caller's wait for a verdict; `step_budget_ms` is the most one request's guided rows
    may cost per decoding step, measured along a walk of `walk_steps` steps."""

    def __init__(self, *, time_limit_s: float = 10.0, start_time_limit_s: float = 120.0,
                 cache_entries: int = 4096, threads: int = 1, processes: int = 2, per_key: int = 1,
                 wait_s: float = 15.0, step_budget_ms: float = 4.0, walk_steps: int = 8,
                 python: str = sys.executable):
        self.time_limit_s, self.wait_s = time_limit_s, wait_s
        self.step_budget_ms, self.walk_steps = step_budget_ms, walk_steps
        self._cache_entries = cache_entries
        command = [python, "-m", "orchestrator.structured.grammar.checker_process", "--threads", str(threads)]
        self._links = [CheckerLink(command, start_time_limit_s) for _ in range(processes)]
        self._idle: asyncio.Queue[CheckerLink] = asyncio.Queue()
        for link in self._links:
            self._idle.put_nowait(link)
        self._per_key = per_key
        self._key_gates: dict[str, asyncio.Semaphore] = {}
        self._key_checks: Counter[str] = Counter()  # checks of each key in flight or waiting for its gate
        self._outcomes: OrderedDict[str, _Outcome] = OrderedDict()
        self._inflight: dict[str, _Pending] = {}
        self._unavailable: str | None = None
        self.round_trips = 0  # compile requests sent to a process

    @property
    def restarts(self) -> int:
        """Processes killed for a time limit or found dead."""
        return sum(link.restarts for link in self._links)

    @property
    def xgrammar_version(self) -> str | None:
        return next((link.xgrammar_version for link in self._links if link.xgrammar_version), None)

    async def start(self) -> None:
        """Start the processes now rather than on the first check (each takes seconds to import xgrammar)."""
        links = [await self._idle.get() for _ in self._links]
        try:
            await asyncio.gather(*(self._started(link) for link in links))
        finally:
            for link in links:
                self._idle.put_nowait(link)

    async def check(self, folder: Path, guide: Guide, *, stop_token_ids: tuple[int, ...] | None = None,
                    vocab_size: int | None = None, rows: int = 1, key: str | None = None) -> None:
        """Return if `guide` compiles over the vocabulary of engine folder `folder` and `rows` rows of it fit
        the step budget; raise InvalidRequest (naming the guide's field) if it is too deep or large to compile,
        xgrammar refuses it, it takes longer than the time limit or costs too much per step. Raises
        UnsupportedParameter when xgrammar is not installed, ModelUnavailable (with a retry time) when no
        verdict came within `wait_s`, or when the checker cannot start or read the vocabulary. `key` names
        the caller, whose checks in flight are capped; None (a server without keys, where every caller is the
        same anonymous one) takes only a free process of the pool."""
        check_structure(guide)
        vocab = _vocab_ref(folder, stop_token_ids, vocab_size)
        okey = hashlib.sha256(f"{vocab.key}\0{guide.kind}\0{guide.text}".encode()).hexdigest()  # vocabulary and guide
        outcome = self._outcomes.get(okey)
        if outcome is not None:
            self._outcomes.move_to_end(okey)
        else:
            outcome = await self._wait(okey, vocab, guide, key)
        if outcome.verdict != "ok":
            raise InvalidRequest(self._message(guide, outcome), param=guide.param)
        if outcome.step_ms * rows > self.step_budget_ms:
            raise InvalidRequest(self._costly(guide, outcome.step_ms, rows), param=guide.param)

    async def close(self) -> None:
        for pending in list(self._inflight.values()):
            pending.task.cancel()
        for link in self._links:
            await link.kill(restart=False)

    async def _wait(self, okey: str, vocab: VocabRef, guide: Guide, key: str | None) -> _Outcome:
        """The verdict of the check of `okey`, started here unless one is in flight; a caller that stops
        waiting leaves a started check running (its verdict is remembered) and drops one nobody waits for."""
        pending = self._inflight.get(okey)
        if pending is None:
            pending = _Pending(asyncio.ensure_future(self._resolve(okey, vocab, guide, key)))
            pending.task.add_done_callback(_retrieve)  # its error may outlive every caller's wait
            self._inflight[okey] = pending
        pending.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(pending.task), self.wait_s)
        except TimeoutError:
            field = guide.param or f"the {guide.kind} constraint"
            raise ModelUnavailable(
                f"{field}: the grammar checker is busy; no verdict within {self.wait_s:g} s, try again",
                retry_after_s=self.time_limit_s,
            ) from None
        finally:
            pending.waiters -= 1
            if pending.waiters == 0 and not pending.started and not pending.task.done():
                pending.task.cancel()
                if self._inflight.get(okey) is pending:
                    del self._inflight[okey]

    async def _resolve(self, okey: str, vocab: VocabRef, guide: Guide, key: str | None) -> _Outcome:
        pending = self._inflight[okey]  # set by the caller before this task first runs
        if key is None:
            gate: asyncio.Semaphore | contextlib.nullcontext = contextlib.nullcontext()
        else:
            gate = self._key_gates.setdefault(key, asyncio.Semaphore(self._per_key))
            self._key_checks[key] += 1
        try:
            async with gate:
                link = await self._idle.get()
                pending.started = True
                try:
                    outcome = await self._compile(link, vocab, guide)
                finally:
                    self._idle.put_nowait(link)
            if outcome.definite:
                self._outcomes[okey] = outcome
                while len(self._outcomes) > self._cache_entries:
                    self._outcomes.popitem(last=False)
            return outcome
        finally:
            if self._inflight.get(okey) is pending:
                del self._inflight[okey]
            if key is not None:
                self._key_checks[key] -= 1
                if not self._key_checks[key]:
                    del self._key_checks[key], self._key_gates[key]

    async def _compile(self, link: CheckerLink, vocab: VocabRef, guide: Guide) -> _Outcome:
        await self._started(link)
        kind, text = guide.compiled_form()
        message = {"op": "compile", "vocab": vocab.key, "kind": kind, "text": text, "steps": self.walk_steps}
        self.round_trips += 1
        try:
            reply = await link.compile(vocab, message, self.time_limit_s)
        except TimeoutError:
            return _Outcome("slow")
        except CheckerGone as exc:
            return _Outcome("crashed", str(exc))
        if not reply["ok"]:
            return _Outcome("refused", reply["error"])
        return _Outcome("ok", step_ms=float(reply.get("step_ms", 0.0)))

    async def _started(self, link: CheckerLink) -> None:
        if self._unavailable is not None:
            raise UnsupportedParameter(self._unavailable)
        try:
            await link.ensure_started()
        except XgrammarMissing as exc:
            self._unavailable = str(exc)
            raise UnsupportedParameter(self._unavailable) from None

    def _message(self, guide: Guide, outcome: _Outcome) -> str:
        field = guide.param or f"the {guide.kind} constraint"
        if outcome.verdict == "refused":
            return f"{field} cannot be enforced: xgrammar refused it: {outcome.reason}"
        if outcome.verdict == "slow":
            return f"{field}: the grammar took longer than {self.time_limit_s:g} s to compile; simplify it"
        return f"{field}: the grammar checker crashed compiling this grammar ({outcome.reason})"

    def _costly(self, guide: Guide, step_ms: float, rows: int) -> str:
        field = guide.param or f"the {guide.kind} constraint"
        cost = f"{step_ms:.2f} ms per row per decoding step"
        if rows > 1:
            cost += f", {step_ms * rows:.2f} ms for its {rows} rows (n)"
        return f"{field}: enforcing this grammar costs {cost}; the limit is {self.step_budget_ms:g} ms; simplify it"


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


@dataclass
class _Pending:
    """A check in flight: its task, how many callers wait for it, and whether it holds a process yet."""

    task: asyncio.Task
    waiters: int = 0
    started: bool = False


def _vocab_ref(folder: Path, stop_token_ids: tuple[int, ...] | None, size: int | None) -> VocabRef:
    folder = Path(folder).resolve()
    try:
        stat = (folder / "tokenizer.json").stat()  # a rebuilt engine folder is a new vocabulary
    except OSError as exc:
        raise ModelUnavailable(f"the grammar checker found no tokenizer.json in {folder}") from exc
    stops = tuple(stop_token_ids) if stop_token_ids else None
    key = json.dumps([str(folder), stat.st_mtime_ns, stat.st_size, stops, size])
    return VocabRef(hashlib.sha256(key.encode()).hexdigest(), str(folder), stops, size)
