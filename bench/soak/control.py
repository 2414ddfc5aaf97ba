"""The soak run's calls besides generation: the admin API (load and unload by hand, the placement) and the
probes a deployment makes all the time (/health, /ready, /metrics, /v1/models), each checked."""

from __future__ import annotations

import aiohttp
import orjson

from bench.soak.requests import Outcome

BUSY = "unload it when idle"  # the admin API's refusal of an unload while the model serves (scheduler/admin.py)
PROBES = ("/health", "/ready", "/metrics", "/v1/models")


async def admin_call(session: aiohttp.ClientSession, base_url: str, model: str, action: str) -> Outcome:
    """POST /admin/models/{model}/{action}. A 503 refusing to unload a busy model is an expected answer."""
    try:
        async with session.post(f"{base_url}/admin/models/{model}/{action}") as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Outcome("admin", type(exc).__name__, f"{action} {model}: {exc}")
    if status == 200:
        return Outcome("admin", note=action)
    if status == 503 and action == "unload" and BUSY in text:
        return Outcome("admin", note="unload refused: busy")
    return Outcome("admin", f"HTTP {status}", f"{action} {model}: {text[:160]}")


async def placement(session: aiohttp.ClientSession, base_url: str) -> dict:
    """GET /admin/models: every model's state, and the spare worker's."""
    async with session.get(f"{base_url}/admin/models") as response:
        response.raise_for_status()
        return await response.json()


def _probe_problem(path: str, body: bytes) -> str | None:
    if path == "/metrics":
        return None if b"inferno_build_info" in body else "no inferno_build_info"
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "not JSON"
    if path == "/health" and answer != {"status": "ok"}:
        return "health not ok"
    if path == "/ready" and answer.get("ready") is not True:
        return "not ready"
    if path == "/v1/models" and not answer.get("data"):
        return "no models listed"
    return None


async def probe(session: aiohttp.ClientSession, base_url: str, path: str) -> Outcome:
    """GET `path`: 200 and the body it must have."""
    try:
        async with session.get(f"{base_url}{path}") as response:
            body = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Outcome("probe", type(exc).__name__, f"{path}: {exc}")
    if status != 200:
        return Outcome("probe", f"HTTP {status}", f"{path}: {body[:160].decode(errors='replace')}")
    problem = _probe_problem(path, body)
    return Outcome("probe", f"{path}: {problem}", body[:160].decode(errors="replace")) if problem else Outcome("probe")
