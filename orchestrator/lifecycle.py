"""One object owns a request's whole life in the HTTP process: status, timestamps, choices and the queue its
engine output arrives on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from orchestrator.engine.request import EngineRequest, FinishReason
from orchestrator.errors import InfernoError, from_wire
from orchestrator.ipc.messages import (
    PLAIN_ROW_LEN,
    ROW_FINISH,
    ROW_NUM_TOKENS,
    ROW_REQUEST_ID,
    ROW_TEXT,
    TextDelta,
)
from orchestrator.structured.guide import Guide
from orchestrator.supervisor.handle import WorkerHandle


class RequestStatus(IntEnum):
    """Ordered: everything from FINISHED_STOPPED on is finished."""

    WAITING = 0  # admitted, waiting for a permit (or for its model to load)
    RUNNING = 1  # in the engine
    FINISHED_STOPPED = 2
    FINISHED_LENGTH = 3
    FINISHED_CANCELLED = 4  # the client went away
    FINISHED_ERROR = 5

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def label(self) -> str:
        """The finish_reason label of the request metrics, in FinishReason's words: stop (tool calls too), length,
        cancelled or error."""
        return _LABELS[self].value


_LABELS = {RequestStatus.FINISHED_STOPPED: FinishReason.STOP, RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
           RequestStatus.FINISHED_CANCELLED: FinishReason.CANCELLED, RequestStatus.FINISHED_ERROR: FinishReason.ERROR}


@dataclass
class Choice:
    index: int
    engine_request: EngineRequest
    completion_tokens: int = 0
    finish: FinishReason | None = None
    error: InfernoError | None = None
    logprobs: list | None = None  # every token's [text, log probability, alternatives], for a whole response
    parts: list[str] = field(default_factory=list)  # the text so far, for a whole response
    reasoning: str = ""  # the thinking so far, for a whole response
    tool_calls: list[dict] = field(default_factory=list)  # whole calls (id, type, function), for a whole response

    def add_tool_call_deltas(self, deltas: list[dict]) -> None:
        """Join streamed tool-call entries into whole calls: a new index opens a call, the rest are arguments."""
        for delta in deltas:
            index, function = delta["index"], delta.get("function", {})
            if index == len(self.tool_calls):
                self.tool_calls.append({"id": delta["id"], "type": "function",
                                        "function": {"name": function.get("name", ""), "arguments": ""}})
            self.tool_calls[index]["function"]["arguments"] += function.get("arguments", "")


@dataclass
class InferenceRequest:
    id: str  # the response id the client sees ("chatcmpl-…"); its engine requests are "<id>.<choice index>"
    model: str
    prompt_tokens: int
    choices: list[Choice]
    stream: bool
    echo: str | None = None  # the prompt's text, when the response begins with it (completions' echo)
    guide: Guide | None = None  # the grammar every choice follows, checked before the request is admitted
    cached_tokens: int | None = None  # prompt tokens the engine served from its prefix cache, where it says
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    status: RequestStatus = RequestStatus.WAITING
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # what its handler must see, in order
    # Takes a plain text row (choice, text) without waking the handler; returns False to send it to `events`.
    fast_path: Callable[[Choice, str], bool] | None = None
    keeps_output: bool = False  # collect each choice's output on it (a whole response; an agent API's stream)
    attachable: bool = True  # the worker may write its text to the client unseen here (not where audited)
    attached: bool = False  # its client's socket went to its worker with the submit (api/generation.py)
    worker: WorkerHandle | None = None  # the worker running it, once leased
    _by_engine_id: dict[str, Choice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keeps_output = self.keeps_output or not self.stream
        self._by_engine_id = {choice.engine_request.id: choice for choice in self.choices}

    # -- engine side -------------------------------------------------------------------------------------
    def deliver(self, row: list) -> None:
        """The worker client's sink: one call per engine step that produced output for this request, with its
        wire row (`TextDelta.to_wire`). Plain text goes the fast path when there is one and nothing is queued
        ahead of it (order is kept); anything else (a finish, an error, extras) wakes the handler."""
        fast = self.fast_path
        if fast is not None and len(row) == PLAIN_ROW_LEN and row[ROW_FINISH] is None and self.events.empty():
            choice = self._by_engine_id[row[ROW_REQUEST_ID]]
            if fast(choice, row[ROW_TEXT]):
                self._count_tokens(choice, row[ROW_NUM_TOKENS])
                return
        self.events.put_nowait(TextDelta.from_wire(row))

    def _count_tokens(self, choice: Choice, count: int) -> None:
        if count:
            now = time.monotonic()
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
            choice.completion_tokens += count

    def start(self) -> None:
        self.status = RequestStatus.RUNNING
        self.started = time.monotonic()

    def record(self, delta: TextDelta) -> Choice:
        """Account for one delta taken off `events`; returns the choice it belongs to."""
        choice = self._by_engine_id[delta.request_id]
        if delta.first_token is not None and self.first_token is None:
            self.first_token = delta.first_token  # its worker wrote the first tokens to the client itself
        self._count_tokens(choice, delta.num_tokens)
        if delta.cached_tokens is not None:
            self.cached_tokens = max(self.cached_tokens or 0, delta.cached_tokens)
        if self.keeps_output:
            choice.parts.append(delta.text)
            if delta.logprobs is not None:
                if choice.logprobs is None:
                    choice.logprobs = []
                choice.logprobs.extend(delta.logprobs)
            if delta.reasoning:
                choice.reasoning += delta.reasoning
            if delta.tool_calls:
                choice.add_tool_call_deltas(delta.tool_calls)
        if delta.finish is not None:
            choice.finish = delta.finish
            if delta.error is not None:
                choice.error = from_wire(delta.error)
        return choice

    @property
    def all_finished(self) -> bool:
        return all(choice.finish is not None for choice in self.choices)

    @property
    def completion_tokens(self) -> int:
        return sum(choice.completion_tokens for choice in self.choices)

    def unfinished_engine_ids(self) -> list[str]:
        return [c.engine_request.id for c in self.choices if c.finish is None]

    def finish(self, status: RequestStatus) -> None:
        if not self.status.finished:
            self.status = status
            self.finished = time.monotonic()

    def final_status(self) -> RequestStatus:
        """The status its choices add up to, once all are finished."""
        reasons = {choice.finish for choice in self.choices}
        if FinishReason.ERROR in reasons:
            return RequestStatus.FINISHED_ERROR
        if reasons == {FinishReason.LENGTH}:
            return RequestStatus.FINISHED_LENGTH
        return RequestStatus.FINISHED_STOPPED
