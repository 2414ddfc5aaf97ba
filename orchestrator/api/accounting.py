"""What a finished request is charged and what is written of it, once its final status is known (outcome.py):
the key's limiter gets its running request back and its tokens charged, generation requests are metered per key
(access/usage.py), and the audit log gets its line (access/audit.py). Probes and scrapes (/health, /ready,
/metrics) are not audited."""

from __future__ import annotations

import time

from aiohttp import web

from orchestrator.access.audit import AuditLog
from orchestrator.access.usage import UsageMeter
from orchestrator.api.auth import UNAUDITED_PATHS
from orchestrator.api.record import RequestRecord


class Accounting:
    def __init__(self, usage: UsageMeter, audit: AuditLog):
        self._usage, self._audit = usage, audit

    def settle(self, http: web.Request, record: RequestRecord) -> None:
        request = record.inference
        ran = request is not None and request.started is not None
        prompt_tokens = request.prompt_tokens if ran else 0
        completion_tokens = request.completion_tokens if ran else 0
        if record.limiter is not None:
            record.limiter.finish(record.tokens_taken, prompt_tokens + completion_tokens, record.choices_taken)
        key = record.caller.name if record.caller is not None else None
        if record.generation and record.model is not None and key is not None:
            engine_seconds = (request.finished or time.monotonic()) - request.started if ran else 0.0
            self._usage.record(key, record.model, record.status, prompt_tokens, completion_tokens, engine_seconds)
        if self._audit.enabled and http.path not in UNAUDITED_PATHS:
            self._audit.write(_audit_entry(http, record, record.status, self._audit.include_text))


def _audit_entry(http: web.Request, record: RequestRecord, status: int, include_text: bool) -> dict:
    entry = {"request_id": record.id, "key": record.caller.name if record.caller is not None else None,
             "method": http.method, "path": http.path, "model": record.model, "status": status,
             "latency_s": round(time.monotonic() - record.arrived, 6)}
    request = record.inference
    if request is not None:
        entry["prompt_tokens"] = request.prompt_tokens
        entry["completion_tokens"] = request.completion_tokens
        entry["response_id"] = request.id
        entry["finish_reason"] = request.status.label if request.status.finished else None
    if include_text and record.prompt_text is not None:
        entry["prompt"] = record.prompt_text
        entry["completions"] = ["".join(texts) for texts in (record.completions or {}).values()]
    return entry
