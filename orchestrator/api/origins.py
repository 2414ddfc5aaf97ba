"""Browser origins (CORS), off by default as in Ollama: a request with an `Origin` header (a browser's, on
behalf of some web page) is refused with 403 unless the origin is in `http.allowed_origins`. Requests
without one (curl, SDKs, servers) are untouched. An allowed origin gets CORS headers on every response and
an answer to its preflight (OPTIONS) requests, so a web page there can call the API with a key.

Refusing unknown origins keeps web pages the user happens to visit (or DNS rebinding) from using a server
on localhost or inside a private network."""

from __future__ import annotations

from aiohttp import web

from orchestrator.errors import OriginNotAllowed

ALLOWED_ORIGIN = web.RequestKey("inferno_allowed_origin", str)
PREFLIGHT_MAX_AGE_S = 600
DEFAULT_ALLOWED_HEADERS = "Authorization, Content-Type"
EXPOSED_HEADERS = "X-Request-Id, Retry-After"


def origins_middleware(allowed_origins: tuple[str, ...]):
    allow_any = "*" in allowed_origins
    allowed = frozenset(origin.rstrip("/") for origin in allowed_origins)

    @web.middleware
    async def check(http: web.Request, handler) -> web.StreamResponse:
        origin = http.headers.get("Origin")
        if origin is None:
            return await handler(http)
        if not (allow_any or origin in allowed):
            raise OriginNotAllowed(
                f"requests from the web origin {origin!r:.100} are not allowed by this server "
                "(its operator can allow origins with --http.allowed-origins)"
            )
        http[ALLOWED_ORIGIN] = origin
        if http.method == "OPTIONS" and "Access-Control-Request-Method" in http.headers:
            return web.Response(status=204, headers=_preflight_headers(http))
        return await handler(http)

    return check


def _preflight_headers(http: web.Request) -> dict[str, str]:
    asked = http.headers.get("Access-Control-Request-Headers", "")
    headers = ", ".join(h.strip() for h in asked.split(",") if h.strip().replace("-", "").isalnum())
    return {"Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Allow-Headers": headers or DEFAULT_ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)}


async def stamp_cors(http: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: CORS headers on every response to an allowed origin, streams included."""
    if "Origin" not in http.headers:  # most requests: no browser, nothing to look up
        return
    origin = http.get(ALLOWED_ORIGIN)
    if origin is None:
        return
    response.headers["Access-Control-Allow-Origin"] = origin
    response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
    response.headers.add("Vary", "Origin")
