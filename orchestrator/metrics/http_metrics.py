"""HTTP request durations by route, method and status, measured by an aiohttp middleware."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

# Seconds: /health and /metrics answer in milliseconds, a streamed generation can run for minutes.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0, 600.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CLIENT_GONE = 499  # the client went away before the response ended (nginx's convention)


def _route(http: web.Request) -> str:
    """The route's pattern (`/v1/models/{model}`), never the raw path: the label's values stay few."""
    resource = http.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def http_metrics_middleware(registry: CollectorRegistry):
    duration = Histogram(
        "inferno_http_request_duration_seconds",
        "Seconds from receiving an HTTP request to the end of its response (a whole stream), by route, "
        "method and status.",
        ["route", "method", "status"],
        buckets=HTTP_BUCKETS,
        registry=registry,
    )

    @web.middleware
    async def http_metrics(http: web.Request, handler) -> web.StreamResponse:
        started = time.monotonic()
        status = 500  # what aiohttp answers for an exception no inner middleware turned into a response
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
            method = http.method if http.method in METHODS else "other"
            duration.labels(_route(http), method, str(status)).observe(time.monotonic() - started)

    return http_metrics
