"""Streaming tool-call parsing: text deltas in, OpenAI-shaped events out, for any format in tool_formats.py.

Fed the model's text as it arrives, `ToolCallParser.feed` returns events: `ContentDelta` for plain text, and
for each call, once its object is complete, `ToolCallStart` (index, id `call_` + 24 hex digits, function name)
then `ToolCallArguments` with its whole arguments; `finish()` flushes what was held back and `calls` holds the
calls, arguments as a JSON string.

The calls of one turn (docs/structured-outputs.md, "The calls of a turn"):
- a call is sent whole, once its arguments are complete, so a client never receives a call it cannot use;
- a call cut short by the end of the output (max_tokens) is not a call: it is dropped, not made content;
- a call identical to an earlier call of the turn (same name, same arguments as JSON values) ends the turn:
  it is dropped and `ended` is set, so the worker finishes the request there; repeating a call adds nothing.

In `auto` mode text passes through as content; only what could still be the start of a call is held back
(a partial marker; for llama3_json, an answer that opens with `{` until it is known to be a call or not).
Text that looked like a call but is not one comes out as content. With `forced=True` (tool_choice
required or named, enforced by a grammar) the output is calls from the start, and the format's marker
may be missing (a detokeniser that skips special tokens drops it).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.structured.markers import partial_suffix
from orchestrator.structured.tool_call_scan import CallObjectScan
from orchestrator.structured.tool_formats import ToolFormat

_WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    index: int
    fragment: str


ToolEvent = ContentDelta | ToolCallStart | ToolCallArguments


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


def delta_of(event: ToolCallStart | ToolCallArguments) -> dict:
    """`delta.tool_calls[i]` of a streamed chunk: id, type and name once, then argument fragments."""
    if isinstance(event, ToolCallStart):
        return {"index": event.index, "id": event.id, "type": "function",
                "function": {"name": event.name, "arguments": ""}}
    return {"index": event.index, "function": {"arguments": event.fragment}}


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolCallParser:
    """Streaming parser of one choice's output in format `fmt` (see the module docstring)."""

    def __init__(self, fmt: ToolFormat, *, forced: bool = False, id_factory: Callable[[], str] = new_call_id):
        self.fmt = fmt
        self.forced = forced
        self.calls: list[ToolCall] = []
        self.ended = False  # a call repeated an earlier one: the turn is over, nothing more is read
        self._in_calls = forced  # calls have begun: what is left at the end is a call cut short
        self._seen: set[tuple[str, str]] = set()  # (name, normal arguments) of each call so far
        self._new_id = id_factory
        self._buffer = ""  # text not yet decided
        self._held = ""  # text taken since the last call: content after all if no call follows
        self._state = "opening" if forced else ("start" if fmt.calls_at_start_only else "content")
        self._call: CallObjectScan | None = None
        self._call_name: str | None = None  # the current call's function, once its head is read
        self._arguments = ""
        self._out: list[ToolEvent] = []

    def feed(self, text: str) -> list[ToolEvent]:
        self._buffer += text
        while self._buffer and getattr(self, f"_on_{self._state}")():
            pass
        return self._drain()

    def finish(self) -> list[ToolEvent]:
        """The end of the output: what was held back is content, unless calls had begun (forced, or a format's
        marker or a call's name read): then it is a call cut short, neither a call nor the answer's text, and
        is dropped."""
        call = self._call
        rest = self._held + (call.raw if call is not None else "") + self._buffer
        cut = self._in_calls and self._state not in ("content", "start", "text")
        if not (self.ended or cut) and (self._state in ("content", "start", "text") or rest.strip()):
            self._emit_content(rest)
        self._buffer = self._held = ""
        self._call = self._call_name = None
        return self._drain()

    # -- states: each consumes from the buffer and returns True to run again, False to wait for text --

    def _on_content(self) -> bool:
        trigger = self.fmt.marker or self.fmt.call_open.strip()
        found = self._buffer.find(trigger)
        if found < 0:
            keep = partial_suffix(self._buffer, trigger)
            self._emit_content(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        self._emit_content(self._buffer[:found])
        self._buffer = self._buffer[found:]
        self._take(len(trigger))
        self._state = "list_open" if self.fmt.marker else "call_body"
        self._in_calls = True
        return True

    def _on_start(self) -> bool:
        """llama3_json: calls only open the answer, after whitespace and maybe `<|python_tag|>`."""
        stripped = self._buffer.lstrip(_WHITESPACE)
        marker = self.fmt.optional_marker
        if not stripped or (marker and marker.startswith(stripped)):
            return False
        if marker and stripped.startswith(marker):
            self._take(len(self._buffer) - len(stripped) + len(marker))
        self._state = "call_body" if self._buffer.lstrip(_WHITESPACE)[:1] in ("{", "") else "text"
        return True

    def _on_opening(self) -> bool:
        """Forced calls: the format's marker may be there or not."""
        stripped = self._buffer.lstrip(_WHITESPACE)
        for marker in filter(None, (self.fmt.marker, self.fmt.optional_marker)):
            if marker.startswith(stripped) and marker != stripped:
                return False
            if stripped.startswith(marker):
                self._take(len(self._buffer) - len(stripped) + len(marker))
                break
        self._state = "list_open"
        return True

    def _on_list_open(self) -> bool:
        return self._expect(self.fmt.list_open, "call_open")

    def _on_call_open(self) -> bool:
        return self._expect(self.fmt.call_open, "call_body")

    def _on_call_body(self) -> bool:
        if self._call is None:
            stripped = self._buffer.lstrip(_WHITESPACE)
            if not stripped:
                return False
            if stripped[0] != "{":
                return self._not_a_call()
            self._take(len(self._buffer) - len(stripped))
            self._call = CallObjectScan()
        used = self._call.feed(self._buffer)
        self._buffer = self._buffer[used:] if used is not None else ""
        if self._call_name is None and self._call.name is not None:
            self._announce(self._call.name)
        if self._call_name is not None:
            self._arguments += self._call.streamable()
        return used is not None and self._end_call()

    def _on_call_close(self) -> bool:
        closed = self._expect(self.fmt.call_close, "between")
        if closed:
            self._held = ""  # the call's own closing text is never content
        return closed

    def _on_between(self) -> bool:
        """After a call: another call, the end of the list, or (hermes) maybe text."""
        stripped = self._buffer.lstrip(_WHITESPACE)
        if not stripped:
            return False
        for token, state in ((self.fmt.separator.strip(), "call_open"),
                             (self.fmt.list_close.strip(), "after")):
            if token and stripped.startswith(token):
                self._take(len(self._buffer) - len(stripped) + len(token))
                self._state = state
                if state == "after":
                    self._held = ""  # the list's closing bracket is never content
                return True
        opening = self.fmt.call_open.strip()
        if not self.fmt.separator.strip() and opening and opening.startswith(stripped[: len(opening)]):
            if len(stripped) < len(opening):
                return False
            self._state = "call_open"
            return True
        self._state = "after"
        return True

    def _on_after(self) -> bool:
        """Past the calls: what follows is content (and only in hermes may more calls come)."""
        self._held = ""
        self._buffer = self._buffer.lstrip(_WHITESPACE)
        self._state = "text" if self.fmt.calls_at_start_only or self.fmt.marker else "content"
        return bool(self._buffer)

    def _on_ended(self) -> bool:
        """A call repeated an earlier one: whatever the model writes after it is not read."""
        self._buffer = ""
        return False

    def _on_text(self) -> bool:
        self._emit_content(self._buffer)
        self._buffer = ""
        return False

    # -- helpers --

    def _expect(self, literal: str, then: str) -> bool:
        """Skip whitespace, then take `literal` (compared without its own surrounding whitespace)."""
        token = literal.strip()
        stripped = self._buffer.lstrip(_WHITESPACE)
        if token and token.startswith(stripped) and token != stripped:
            return False
        if not stripped.startswith(token):
            return self._not_a_call()
        self._take(len(self._buffer) - len(stripped) + len(token))
        self._state = then
        return True

    def _end_call(self) -> bool:
        call = self._call
        assert call is not None
        if self._call_name is None:  # the keys came in another order: the whole object decides
            parsed = call.parsed()
            if parsed is None:
                return self._not_a_call()
            self._announce(parsed[0])
            self._arguments += parsed[1]
        self._state = "call_close"
        self._commit()
        return True

    def _announce(self, name: str) -> None:
        self._call_name = name
        self._in_calls = True
        self._arguments = ""
        self._held = ""

    def _commit(self) -> None:
        """The current call is complete: sent whole, unless it repeats an earlier call, which ends the turn."""
        assert self._call_name is not None
        key = (self._call_name, _normal_arguments(self._arguments))
        if key in self._seen:
            self.ended = True
            self._state = "ended"
        else:
            self._seen.add(key)
            call = ToolCall(self._new_id(), self._call_name, self._arguments)
            self._out.append(ToolCallStart(len(self.calls), call.id, call.name))
            if call.arguments:
                self._out.append(ToolCallArguments(len(self.calls), call.arguments))
            self.calls.append(call)
        self._call = self._call_name = None
        self._held = ""

    def _not_a_call(self) -> bool:
        """What looked like the start of calls is not: all of it is content, and no call follows."""
        raw = self._call.raw if self._call is not None else ""
        self._emit_content(self._held + raw + self._buffer)
        self._held = self._buffer = ""
        self._call = None
        self._state = "text"
        return False

    def _take(self, count: int) -> None:
        self._held += self._buffer[:count]
        self._buffer = self._buffer[count:]

    def _emit_content(self, text: str) -> None:
        if text:
            self._out.append(ContentDelta(text))

    def _drain(self) -> list[ToolEvent]:
        out, self._out = self._out, []
        return out


def _normal_arguments(arguments: str) -> str:
    """Arguments as a JSON value compared by value (key order and spacing do not matter); text that is not JSON
    as it stands."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
