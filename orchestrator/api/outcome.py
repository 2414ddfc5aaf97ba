"""The first and last word on every request: its record (record.py) is made before anything else runs, and once
the response is done, whatever happened, its final status is worked out here, once, and handed to what observes
it: the HTTP durations (metrics/http_metrics.py) and the accounting (accounting.py: the key's limiter, usage per
key, the audit log). A request whose work goes on after its answer (a background response) is settled when that
work ends."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from orchestrator.api.accounting import Accounting
from orchestrator.api.record import RECORD, RequestRecord
from orchestrator.metrics.http_metrics import CLIENT_GONE, HttpDurations

UNHANDLED = 500  # what aiohttp answers for an exception nobody turned into a response


def outcome_middleware(durations: HttpDurations, accounting: Accounting | None = None):
    @web.middleware
    async def outcome(http: web.Request, handler) -> web.StreamResponse:
        record = http[RECORD] = RequestRecord()
        status = UNHANDLED
        try:
            response = await handler(http)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status = CLIENT_GONE
            raise
        finally:
            record.status = status
            durations.observe(http, status, time.monotonic() - record.arrived)
            if accounting is not None and record.detached is not None:  # settled when its work ends
                record.detached.add_done_callback(lambda _: accounting.settle(http, record))
            elif accounting is not None:
                accounting.settle(http, record)

    return outcome
