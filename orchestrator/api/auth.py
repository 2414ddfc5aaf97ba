"""Bearer keys: none configured means an open server (a local default); once keys are configured, /v1
needs an API key and /admin the admin key. Health, readiness and metrics stay open for probes."""

from __future__ import annotations

import hmac

from aiohttp import web

from orchestrator.config import AuthConfig
from orchestrator.errors import Unauthorized

OPEN_PATHS = ("/health", "/ready", "/metrics")


def _presented(http: web.Request) -> str | None:
    header = http.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(token: str, keys: tuple[str, ...]) -> bool:
    return any(hmac.compare_digest(token, key) for key in keys)


def auth_middleware(auth: AuthConfig):
    api_keys = auth.api_keys + ((auth.admin_key,) if auth.admin_key else ())
    admin_keys = (auth.admin_key,) if auth.admin_key else ()
    keys_configured = bool(api_keys)

    @web.middleware
    async def check(http: web.Request, handler) -> web.StreamResponse:
        if not keys_configured or http.path in OPEN_PATHS:
            return await handler(http)
        token = _presented(http)
        if http.path.startswith("/admin"):
            if not admin_keys:
                raise Unauthorized("the admin API is disabled: API keys are set but no admin key is")
            if token is None or not _matches(token, admin_keys):
                raise Unauthorized("the admin API needs the admin key: Authorization: Bearer <admin key>")
        elif token is None or not _matches(token, api_keys):
            raise Unauthorized("missing or invalid API key: send Authorization: Bearer <key>")
        return await handler(http)

    return check
