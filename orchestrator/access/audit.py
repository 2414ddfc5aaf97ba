"""The audit log: one JSON line per API request, appended to a file by a thread of its own (the event loop only
queues the line), and reopened when logrotate moves the file.

    {"time": "2026-05-09T16:20:00.123+00:00", "request_id": "req_...", "key": "alice", "method": "POST",
     "path": "/v1/chat/completions", "model": "llama3-8b", "status": 200, "prompt_tokens": 12,
     "completion_tokens": 40, "latency_s": 0.84, "response_id": "chatcmpl-...", "finish_reason": "stop"}

Prompts and completions are written only when `audit.include_text` is on (`prompt`, `completions`).
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
from datetime import UTC, datetime
from pathlib import Path

import orjson


class AuditLog:
    def __init__(self, path: Path | None, include_text: bool):
        """No path: nothing is written (`enabled` is False)."""
        self.include_text = include_text
        self.enabled = path is not None
        self._listener: logging.handlers.QueueListener | None = None
        self._logger = logging.getLogger(f"inferno.audit.{id(self)}")
        self._logger.propagate = False  # never into the server's own log
        self._logger.setLevel(logging.INFO)
        if path is None:
            return
        lines: queue.SimpleQueue = queue.SimpleQueue()
        file_handler = logging.handlers.WatchedFileHandler(path, encoding="utf-8")
        file_handler.setFormatter(logging.Formatter("%(message)s"))
        self._queue_handler = logging.handlers.QueueHandler(lines)
        self._logger.addHandler(self._queue_handler)
        self._listener = logging.handlers.QueueListener(lines, file_handler)
        self._listener.start()

    def write(self, entry: dict) -> None:
        """Queue one line; `time` is added (UTC, ISO 8601)."""
        if not self.enabled:
            return
        line = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), **entry}
        self._logger.info(orjson.dumps(line).decode())

    def close(self) -> None:
        """Write out what is queued and close the file."""
        if self._listener is not None:
            self._listener.stop()
            for handler in self._listener.handlers:
                handler.close()
            self._logger.removeHandler(self._queue_handler)
            self._listener = None
