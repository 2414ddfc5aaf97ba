"""API keys (access/keys.py), sent as `Authorization: Bearer` or as Anthropic's `x-api-key`: none configured means an open server (a local default) where every caller is
`anonymous` (an admin on loopback; never on a server opened with --auth.allow-open); once keys are configured,
/v1 and the other API routes need a key, /admin a key with admin rights, and /metrics (which names every key and
model) a key with `metrics = true` or admin rights: Prometheus's scrape key. Health and readiness stay open for
probes (readiness in detail only for an admin key). The key's policy goes on the
request's record for the model checks (access.py) and limits further in."""

from __future__ import annotations

from aiohttp import web

from orchestrator.access.keys import KeyRing
from orchestrator.api.record import record_of
from orchestrator.errors import Unauthorized

OPEN_PATHS = ("/health", "/ready")
METRICS_PATH = "/metrics"
UNAUDITED_PATHS = (*OPEN_PATHS, METRICS_PATH)  # probes and scrapes, every few seconds: not worth an audit line


def _presented(http: web.Request) -> str | None:
    """The key sent as `Authorization: Bearer <key>`, or as `x-api-key: <key>` (Anthropic's clients)."""
    header = http.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return http.headers.get("x-api-key", "").strip() or None


def auth_middleware(keys: KeyRing):
    admins = any(policy.admin for policy in keys.policies)

    @web.middleware
    async def check(http: web.Request, handler) -> web.StreamResponse:
        record = record_of(http)
        if not keys.configured:
            record.caller = keys.anonymous
            if http.path.startswith("/admin") and not keys.anonymous.admin:
                raise Unauthorized("the admin API is closed: this server is open without API keys "
                                   "(--auth.allow-open); configure an admin key to use it")
            return await handler(http)
        token = _presented(http)
        policy = None if token is None else keys.find(token)
        if http.path in OPEN_PATHS:
            record.caller = policy  # a key is not needed here; what it is decides how much /ready tells
            return await handler(http)
        if http.path == METRICS_PATH:
            if policy is None or not policy.may_scrape:
                raise Unauthorized("/metrics needs a scrape key (metrics = true in the keys file) or an admin key: "
                                   "Authorization: Bearer <key>")
        elif http.path.startswith("/admin"):
            if not admins:
                raise Unauthorized("the admin API is disabled: API keys are set but no admin key is")
            if policy is None or not policy.admin:
                raise Unauthorized("the admin API needs an admin key: Authorization: Bearer <admin key>")
        elif policy is None:
            raise Unauthorized("missing or invalid API key: send Authorization: Bearer <key>")
        record.caller = policy
        return await handler(http)

    return check
