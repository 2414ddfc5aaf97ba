"""How a Responses API request's output is written: one response object, or OpenAI's named events.

A stream runs `response.created`, `response.in_progress`; then for each output item, in order, its
`response.output_item.added`, its content (a reasoning item's `response.reasoning_text.*`, a message's
`response.content_part.added` / `response.output_text.delta`... / `response.output_text.done` /
`response.content_part.done`, a function call's `response.function_call_arguments.delta`... / `.done`) and its
`response.output_item.done`; then one terminal event: `response.completed`, `response.incomplete` (the output
ran into max_output_tokens) or `response.failed` (the engine failed after the stream began). Every event carries
its `sequence_number`, counting from 0. An item is closed when the next one opens, or at the end.
"""

from __future__ import annotations

import time

from orchestrator.api.generation import Event
from orchestrator.api.preparation import Prepared
from orchestrator.api.responses_api.output import (
    OutputItem,
    final_status,
    function_call,
    items_of,
    response_body,
    usage,
)
from orchestrator.api.responses_api.wire import ResponsesRequest
from orchestrator.errors import InfernoError
from orchestrator.ipc.messages import TextDelta
from orchestrator.lifecycle import Choice, InferenceRequest


class ResponsesPresenter:
    """One request's presenter (generation.EventPresenter). `final` is the last response object written."""

    def __init__(self, wire: ResponsesRequest, prepared: Prepared):
        self.wire, self.engine = wire, prepared.model.engine
        self.id = "resp_" + prepared.request.id.split("-", 1)[-1]
        self.created_at = int(time.time())
        self.final: dict | None = None
        self._namespaces = wire.namespaces()
        self._sequence = 0
        self._items: list[OutputItem] = []  # a stream's items, in the order they were opened
        self._open: OutputItem | None = None
        self._calls: dict[int, OutputItem] = {}  # a stream's function calls by their tool-call index

    # -- a whole response ---------------------------------------------------------------------------------------
    def response(self, request: InferenceRequest) -> dict:
        choice = request.choices[0]
        return self._finished(request, items_of(choice, self.wire.wants_logprobs, self._namespaces), final_status(choice))

    def _finished(self, request: InferenceRequest, items: list[OutputItem], status: str) -> dict:
        reasoning = "".join(item.text for item in items if item.kind == "reasoning")
        output = [item.render(status if item.kind == "message" else "completed") for item in items]
        self.final = self._body(request, status, output, usage(request, self._count_tokens(reasoning)))
        return self.final

    def _body(self, request: InferenceRequest, status: str, output: list[dict], usage_: dict | None,
              error: dict | None = None) -> dict:
        return response_body(self.wire, request, self.id, self.created_at, status, output, usage_, error)

    def _count_tokens(self, text: str) -> int:
        return len(self.engine.prompts.encode_text(text, add_special_tokens=False)) if text else 0

    # -- a stream -----------------------------------------------------------------------------------------------
    def opening(self, request: InferenceRequest) -> list[Event]:
        body = self._body(request, "in_progress", [], None)
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def delta(self, request: InferenceRequest, choice: Choice, delta: TextDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._grow("reasoning", delta.reasoning)
        if delta.text or delta.logprobs:  # a token may have no text of its own yet
            events += self._grow("message", delta.text, delta.logprobs)
        for entry in delta.tool_calls or ():
            events += self._call_entry(entry)
        return events

    def closing(self, request: InferenceRequest) -> list[Event]:
        choice = request.choices[0]
        status = final_status(choice)
        events = self._close(status)
        if not any(item.kind in ("message", "function_call") for item in self._items):
            events += self._open_item(OutputItem("message")) + self._close(status)  # an empty answer
        body = self._finished(request, self._items, status)
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*events, self._event(name, response=body)]

    def keepalive(self) -> list[Event]:
        return []  # OpenAI defines no keepalive event: an SSE comment

    def failure(self, request: InferenceRequest, error: InfernoError, request_id: str) -> list[Event]:
        events = self._close("incomplete")
        output = [item.render("incomplete") for item in self._items]
        message = f"{error.message} (request {request_id})"
        self.final = self._body(request, "failed", output, None, {"code": "server_error", "message": message})
        return [*events, self._event("response.failed", response=self.final)]

    # -- items --------------------------------------------------------------------------------------------------
    def _grow(self, kind: str, text: str, logprobs: list | None = None) -> list[Event]:
        """More of the open reasoning or message item (opening it, and closing another, first)."""
        events = []
        item = self._open
        if item is None or item.kind != kind:
            item = OutputItem(kind, logprobs=[] if kind == "message" and self.wire.wants_logprobs else None)
            events += self._close("completed") + self._open_item(item)
        item.text += text
        where = {"item_id": item.id, "output_index": self._items.index(item), "content_index": 0}
        if kind == "reasoning":
            return [*events, self._event("response.reasoning_text.delta", **where, delta=text)]
        entries = []
        if item.logprobs is not None and logprobs:
            item.logprobs.extend(logprobs)
            entries = OutputItem("message", logprobs=logprobs).part()["logprobs"]
        return [*events, self._event("response.output_text.delta", **where, delta=text, logprobs=entries)]

    def _call_entry(self, entry: dict) -> list[Event]:
        """One streamed tool-call entry: the first of a call opens its item, the rest add to its arguments."""
        events = []
        function = entry.get("function", {})
        item = self._calls.get(entry["index"])
        if item is None:
            item = self._calls[entry["index"]] = function_call(function.get("name", ""), entry["id"],
                                                               self._namespaces)
            events += self._close("completed") + self._open_item(item)
        arguments = function.get("arguments", "")
        if arguments:
            item.text += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                      output_index=self._items.index(item), delta=arguments))
        return events

    def _open_item(self, item: OutputItem) -> list[Event]:
        self._items.append(item)
        self._open = item
        index = len(self._items) - 1
        events = [self._event("response.output_item.added", output_index=index, item=item.render("in_progress"))]
        if item.kind != "function_call":
            empty = OutputItem(item.kind, logprobs=[] if item.logprobs is not None else None).part()
            events.append(self._event("response.content_part.added", item_id=item.id, output_index=index,
                                      content_index=0, part=empty))
        return events

    def _close(self, status: str) -> list[Event]:
        """The events that close the open item, if any (a message in `status`; the others complete)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._items.index(item)
        where = {"item_id": item.id, "output_index": index}
        if item.kind == "function_call":
            events = [self._event("response.function_call_arguments.done", **where, name=item.name,
                                  arguments=item.text)]
        else:
            part = item.part()
            done = ("response.reasoning_text.done", {"text": item.text}) if item.kind == "reasoning" else (
                "response.output_text.done", {"text": item.text, "logprobs": part.get("logprobs", [])})
            events = [self._event(done[0], **where, content_index=0, **done[1]),
                      self._event("response.content_part.done", **where, content_index=0, part=part)]
        item_status = status if item.kind == "message" else "completed"
        return [*events, self._event("response.output_item.done", output_index=index, item=item.render(item_status))]

    def _event(self, kind: str, /, **data) -> Event:
        event = (kind, {"type": kind, **data, "sequence_number": self._sequence})
        self._sequence += 1
        return event
