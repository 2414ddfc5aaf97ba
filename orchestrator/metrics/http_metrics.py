"""HTTP request durations by route, method and status, observed once per request by the outcome middleware
(api/outcome.py), which works out the final status."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from orchestrator.metrics.registry import histogram

# Seconds: /health and /metrics answer in milliseconds, a streamed generation can run for minutes.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0, 600.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CLIENT_GONE = 499  # the client went away before the response ended (nginx's convention)


def _route(http: web.Request) -> str:
    """The route's pattern (`/v1/models/{model}`), never the raw path: the label's values stay few."""
    resource = http.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


class HttpDurations:
    """inferno_http_request_duration_seconds: one observation per request, with its final status."""

    def __init__(self, registry: CollectorRegistry):
        self._duration = histogram(
            registry, "inferno_http_request_duration_seconds",
            "Seconds from receiving an HTTP request to the end of its response (a whole stream), by route, "
            "method and status.",
            HTTP_BUCKETS, ("route", "method", "status"),
        )

    def observe(self, http: web.Request, status: int, seconds: float) -> None:
        method = http.method if http.method in METHODS else "other"
        self._duration.labels(_route(http), method, str(status)).observe(seconds)
