"""Incremental detokenisation and stop-string matching, run in the worker once per engine step."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from orchestrator.text.byte_level import ByteLevelPieces


class IncrementalDetokenizer:
    """Text for each batch of new tokens, exactly once.

    A character split across tokens (a multi-byte UTF-8 sequence, a byte-fallback run) comes out whole
    with the token that completes it; tokenizers' DecodeStream holds the partial bytes meanwhile.

    With `pieces` (a byte-level tokenizer's table, text/byte_level.py) the same text comes from the tokens'
    bytes, the way DecodeStream makes it for such a decoder: the bytes not yet emitted are decoded (invalid
    ones replaced), and held back while their text ends in U+FFFD (a character not complete yet).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, pieces: ByteLevelPieces | None = None):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._pieces = pieces
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens) if pieces is None else None
        self.held = b""  # the bytes of a character not complete yet

    def push(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        if self._pieces is None:
            return self._stream.step(self._tokenizer, token_ids) or ""
        data = self._pieces.join(token_ids, self._skip_special)
        if self.held:
            data = self.held + data
        text = data.decode("utf-8", "replace")
        if text[-1:] == "\ufffd":
            self.held = data
            return ""
        self.held = b""
        return text


class StopMatcher:
    """Finds stop strings in streamed text, holding back only what could still become one.

    `push` returns the text that is safe to emit and whether a stop string was hit; the stop string and
    anything after it are never emitted, unless `include` keeps the stop string itself. While not `armed`
    (before a request's min_tokens), stop strings are not looked for and nothing is held back.
    """

    def __init__(self, stops: tuple[str, ...], include: bool = False):
        self._stops = tuple(s for s in stops if s)
        self._include = include
        self._pending = ""

    def push(self, text: str, armed: bool = True) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        buffer = self._pending + text
        if not armed:
            self._pending = ""
            return buffer, False
        hits = [(i, len(s)) for s in self._stops if (i := buffer.find(s)) >= 0]
        if hits:
            self._pending = ""
            start, length = min(hits)
            return buffer[: start + length if self._include else start], True
        hold = self._partial_suffix(buffer)
        self._pending = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold], False

    def flush(self) -> str:
        """At the end of the sequence, what was held back is plain text."""
        text, self._pending = self._pending, ""
        return text

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:k]):
                    longest = k
                    break
        return longest
