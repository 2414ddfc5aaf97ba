"""One tool call's JSON object as it streams in: where it ends, its function name as soon as the head
`{"name": NAME, "arguments": ` has arrived, and its arguments text as it grows (a string-encoded
object decoded), which the parser gathers and sends whole once the call is complete."""

from __future__ import annotations

import json
import re

from orchestrator.structured.json_scan import JsonValueEnd

# The head of a call object, up to the first character of its arguments.
_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(arguments|parameters)"\s*:\s*(?=\S)')


class CallObjectScan:
    """One call's JSON object as it arrives: its end, and once the head `{"name": N, "arguments": ` is
    seen, where its arguments start and end."""

    def __init__(self) -> None:
        self.raw = ""
        self.end = JsonValueEnd()
        self.name: str | None = None
        self.arguments_at = -1  # offset of the arguments in raw, once the head is seen
        self.arguments_end = JsonValueEnd()
        self.arguments_len: int | None = None  # length of the arguments text once it ended
        self.sent = 0  # arguments characters already sent as fragments

    def feed(self, text: str) -> int | None:
        """Consume text up to the object's end; that count, or None if the object goes on."""
        used = self.end.feed(text)
        self.raw += text[:used] if used is not None else text
        if self.name is None and (head := _CALL_HEAD.match(self.raw)):
            self.name, self.arguments_at = json.loads(head.group(1)), head.end()
            self._scan_arguments(self.raw[self.arguments_at :])
        elif self.name is not None and self.arguments_len is None:
            self._scan_arguments(text[:used] if used is not None else text)
        return used

    def _scan_arguments(self, text: str) -> None:
        used = self.arguments_end.feed(text)
        if used is not None:
            self.arguments_len = len(self.raw) - self.arguments_at - (len(text) - used)

    def streamable(self) -> str:
        """Arguments text not yet sent (an object's text streams; a string-encoded object waits to end)."""
        if self.name is None or (self.arguments_end.opening == '"' and self.arguments_len is None):
            return ""
        end = self.arguments_at + (self.arguments_len if self.arguments_len is not None else len(self.raw))
        text = self.raw[self.arguments_at + self.sent : end]
        self.sent += len(text)
        return _string_arguments(text) if self.arguments_end.opening == '"' else text

    def parsed(self) -> tuple[str, str] | None:
        """(name, arguments text) of a complete object whose keys came in another order; None if it is not
        a call."""
        try:
            value = json.loads(self.raw)
        except json.JSONDecodeError:
            return None
        arguments = value.get("arguments", value.get("parameters")) if isinstance(value, dict) else None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or arguments is None:
            return None
        return value["name"], arguments if isinstance(arguments, str) else json.dumps(
            arguments, ensure_ascii=False
        )


def _string_arguments(literal: str) -> str:
    try:
        decoded = json.loads(literal)
    except json.JSONDecodeError:
        return literal
    return decoded if isinstance(decoded, str) else literal
