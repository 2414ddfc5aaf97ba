"""Finding where one JSON value ends in streamed text, without parsing it: the tool-call parser needs to
know where a call's object and its arguments end while they are still arriving."""

from __future__ import annotations

_CLOSERS = {"{": "}", "[": "]"}
_DELIMITERS = frozenset(",}] \t\r\n")


class JsonValueEnd:
    """Fed text chunk by chunk, says where the (first) JSON value in it ends.

    Leading whitespace is skipped. Objects, arrays and strings end at their closing character; a bare
    number or literal ends before the next delimiter, or at `finish()`. Brackets inside strings, escaped
    quotes and nesting are handled; validity is not checked (json.loads does that afterwards).
    """

    def __init__(self) -> None:
        self.opening = ""  # the value's first character
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> int | None:
        """Consume `text`; the number of its characters up to and including the value's end, or None
        when the value continues past it."""
        for index, char in enumerate(text):
            if self._step(char):
                self.done = True
                return index + (0 if self._is_bare and char in _DELIMITERS else 1)
        return None

    def finish(self) -> bool:
        """At the end of the text: a bare number or literal ends there; anything else is incomplete."""
        if self._is_bare and self.opening:
            self.done = True
        return self.done

    @property
    def _is_bare(self) -> bool:
        return self.opening != "" and self.opening not in _CLOSERS and self.opening != '"'

    def _step(self, char: str) -> bool:
        """Advance by one character; True when the value has ended (for a bare value: at the delimiter)."""
        if not self.opening:
            if char in " \t\r\n":
                return False
            self.opening = char
            if char == '"':
                self._in_string = True
            elif char in _CLOSERS:
                self._depth = 1
            return False
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
                return self.opening == '"'
            return False
        if self._is_bare:
            return char in _DELIMITERS
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            return self._depth == 0
        return False
