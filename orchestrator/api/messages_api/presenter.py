"""How a Messages API request's output is written: one `Message`, or Anthropic's stream of named events.

A stream runs `message_start` (the message with no content yet, the prompt's usage) and a `ping`; then for each
content block, in order, its `content_block_start`, its `content_block_delta`s (`thinking_delta` then one
`signature_delta` for thinking, `text_delta` for text, one `input_json_delta` with a tool call's whole input, as in the whole message) and its
`content_block_stop`; then `message_delta` (stop reason, stop sequence, final usage) and `message_stop`. A block
is closed when the next one opens, or at the end; an answer with neither text nor tool calls gets an empty text
block, as in the whole message. A failure after the stream began is one `error` event.
"""

from __future__ import annotations

from orchestrator.api.generation import Event
from orchestrator.api.messages_api.output import (
    content_blocks,
    input_json,
    matched_stop,
    message_body,
    signature,
    stop_reason,
    usage,
)
from orchestrator.api.messages_api.wire import MessagesRequest
from orchestrator.api.record import new_id
from orchestrator.engine.request import FinishReason
from orchestrator.errors import InfernoError, anthropic_error_body
from orchestrator.ipc.messages import TextDelta
from orchestrator.lifecycle import Choice, InferenceRequest


class MessagesPresenter:
    """One request's presenter (generation.EventPresenter)."""

    def __init__(self, wire: MessagesRequest):
        self.id = new_id("msg")
        self.stops = tuple(wire.stop_sequences or ())
        self._kinds: list[str] = []  # a stream's blocks' types, in order
        self._open: int | None = None  # the index of the open block
        self._thinking = ""  # the open thinking block's text, for its signature
        self._calls: dict[int, int] = {}  # a stream's tool calls' block indexes, by tool-call index
        self._stop: str | None = None

    # -- a whole message ----------------------------------------------------------------------------------------
    def response(self, request: InferenceRequest) -> dict:
        choice = request.choices[0]
        text = "".join(choice.parts)
        stop = matched_stop(text, self.stops) if choice.finish is FinishReason.STOP else None
        if stop is not None:
            text = text[: len(text) - len(stop)]
        content = content_blocks(choice, text)
        return message_body(self.id, request.model, content, stop_reason(choice.finish, stop), stop, usage(request))

    # -- a stream -----------------------------------------------------------------------------------------------
    def opening(self, request: InferenceRequest) -> list[Event]:
        start = message_body(self.id, request.model, [], None, None, {**usage(request, output=False),
                                                                       "output_tokens": 0})
        return [("message_start", {"type": "message_start", "message": start}), ("ping", {"type": "ping"})]

    def delta(self, request: InferenceRequest, choice: Choice, delta: TextDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._grow("thinking", {"type": "thinking_delta", "thinking": delta.reasoning})
            self._thinking += delta.reasoning
        text = delta.text
        if delta.finish is FinishReason.STOP and self.stops:
            self._stop = matched_stop("".join(choice.parts), self.stops)
            text = text[: len(text) - len(self._stop)] if self._stop is not None else text
        if text:
            events += self._grow("text", {"type": "text_delta", "text": text})
        for entry in delta.tool_calls or ():
            events += self._call_entry(entry)
        return events

    def closing(self, request: InferenceRequest) -> list[Event]:
        choice = request.choices[0]
        events = self._close()
        if not any(kind in ("text", "tool_use") for kind in self._kinds):
            events += self._start({"type": "text", "text": ""}) + self._close()
        reason = stop_reason(choice.finish, self._stop)
        message_delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": self._stop},
                         "usage": usage(request)}
        return [*events, ("message_delta", message_delta), ("message_stop", {"type": "message_stop"})]

    def keepalive(self) -> list[Event]:
        return [("ping", {"type": "ping"})]

    def failure(self, request: InferenceRequest, error: InfernoError, request_id: str) -> list[Event]:
        return [("error", anthropic_error_body(error, request_id))]

    # -- blocks -------------------------------------------------------------------------------------------------
    def _grow(self, kind: str, delta: dict) -> list[Event]:
        """More of the open thinking or text block (opening it, and closing another, first)."""
        events = []
        if self._open is None or self._kinds[self._open] != kind:
            events += self._close()
            empty = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
                "type": "text", "text": ""}
            events += self._start(empty)
        return [*events, self._delta(delta)]

    def _call_entry(self, entry: dict) -> list[Event]:
        """One streamed tool-call entry: the first of a call opens its block, the rest add to its arguments."""
        events = []
        function = entry.get("function", {})
        if entry["index"] not in self._calls:
            events += self._close()
            events += self._start({"type": "tool_use", "id": entry["id"], "name": function.get("name", ""),
                                   "input": {}})
            self._calls[entry["index"]] = self._open
        arguments = function.get("arguments", "")
        if arguments:  # a call comes whole, so its input is known: the same object a whole message gives
            events.append(self._delta({"type": "input_json_delta", "partial_json": input_json(arguments)},
                                      self._calls[entry["index"]]))
        return events

    def _start(self, block: dict) -> list[Event]:
        self._kinds.append(block["type"])
        self._open = len(self._kinds) - 1
        return [("content_block_start", {"type": "content_block_start", "index": self._open, "content_block": block})]

    def _delta(self, delta: dict, index: int | None = None) -> Event:
        index = self._open if index is None else index
        return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _close(self) -> list[Event]:
        index, self._open = self._open, None
        if index is None:
            return []
        events = []
        if self._kinds[index] == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": signature(self._thinking)}, index))
            self._thinking = ""
        return [*events, ("content_block_stop", {"type": "content_block_stop", "index": index})]
