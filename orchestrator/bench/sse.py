"""Counting an OpenAI stream's SSE events without parsing them: per event only a timestamp and a count.

Only the rare events are parsed as JSON: the usage chunk (its token counts) and error events. Whether an
event carries new text is read from its bytes: a JSON string value cannot contain an unescaped quote, so a
key such as `"content":` followed by `"` and a character other than `"` means non-empty text, whatever the
text itself holds.
"""

from __future__ import annotations

import orjson

from orchestrator.bench.record import RequestTiming

CHAT_TEXT_KEYS = (b'"content":', b'"reasoning_content":', b'"reasoning":')
COMPLETION_TEXT_KEYS = (b'"text":',)
_DONE = b"[DONE]"
_ERROR_KEY_WITHIN = 16  # an error event's "error" is its first key: {"error": {...}}


class SseCounter:
    """Feeds one response body's bytes (any split: half an event, several events) into a RequestTiming:
    a timestamp per output-bearing event, every data event counted, usage and errors parsed."""

    __slots__ = ("_buffer", "_keys", "_separator", "done", "record")

    def __init__(self, record: RequestTiming, chat: bool):
        self.record = record
        self.done = False  # `data: [DONE]` seen
        self._keys = CHAT_TEXT_KEYS if chat else COMPLETION_TEXT_KEYS
        self._buffer = b""
        self._separator: bytes | None = None  # b"\n\n", or b"\r\n\r\n" for servers that write CRLF

    def feed(self, data: bytes, now: float) -> None:
        """Everything that arrived in one read, at time `now`."""
        buffer = self._buffer + data if self._buffer else data
        separator = self._separator or self._detect_separator(buffer)
        if separator is None:
            self._buffer = buffer
            return
        start = 0
        while (end := buffer.find(separator, start)) != -1:
            self._event(buffer[start:end], now)
            start = end + len(separator)
        self._buffer = buffer[start:]

    def _detect_separator(self, buffer: bytes) -> bytes | None:
        lf, crlf = buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")
        if lf == -1 and crlf == -1:
            return None
        self._separator = b"\r\n\r\n" if crlf != -1 and (lf == -1 or crlf < lf) else b"\n\n"
        return self._separator

    def _event(self, event: bytes, now: float) -> None:
        # The common case (a text chunk) costs a few finds and no function calls.
        if event.startswith(b"data: "):
            payload = event[6:]
        elif event.startswith(b"data:"):
            payload = event[5:].lstrip()
        else:  # comments (": ping"), or "event:"/"id:" lines before the data line
            at = event.find(b"\ndata:")
            if at == -1:
                return
            payload = event[at + 6 :].lstrip()
        record = self.record
        if payload[:1] != b"{":
            if payload.rstrip() == _DONE:
                self.done = True
                record.end = now
            return
        record.events += 1
        for key in self._keys:
            at = payload.find(key)
            if at != -1:
                at += len(key)
                while payload[at : at + 1] == b" ":
                    at += 1
                if payload[at : at + 1] == b'"' and payload[at + 1 : at + 2] != b'"':
                    record.token_times.append(now)
                    break
        if b'"error"' in payload[:_ERROR_KEY_WITHIN] and self._error(payload):
            return
        at = payload.rfind(b'"usage":')  # last in every chunk that has it: found from the end
        if at != -1 and payload[at + 8 : at + 10].lstrip()[:1] == b"{":
            self._usage(payload)

    def _usage(self, payload: bytes) -> None:
        usage = orjson.loads(payload).get("usage") or {}
        self.record.output_tokens = usage.get("completion_tokens")
        self.record.prompt_tokens = usage.get("prompt_tokens")

    def _error(self, payload: bytes) -> bool:
        """Records an error event; False when the event is something else."""
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.record.error = f"unreadable SSE event: {payload[:200]!r}"
            return True
        error = body.get("error") if isinstance(body, dict) else None
        if error is None:
            return False
        message = error.get("message") if isinstance(error, dict) else str(error)
        self.record.error = f"error event in the stream: {message}"
        return True
