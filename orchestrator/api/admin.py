"""The admin API: see and steer model placement by hand, under the same ledger rules as requests; and each API
key's usage and limits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict

from aiohttp import web

from orchestrator.api.state import STATE
from orchestrator.scheduler import ModelSnapshot, Scheduler


def _model(model: ModelSnapshot, engines: dict) -> dict:
    """A model's snapshot, and what it simulates when it is a sim engine."""
    simulation = engines[model.name].manifest.simulation
    return {**asdict(model), "simulated": simulation is not None, "simulation": simulation and simulation.model_dump()}


def _describe(http: web.Request) -> dict:
    state = http.app[STATE]
    scheduler = state.scheduler
    return {"models": [_model(model, state.catalogue.engines) for model in scheduler.snapshot()],
            "devices": [asdict(device) for device in scheduler.device_memory()],
            "ledger": asdict(scheduler.memory()), "spare_worker": scheduler.spare_worker,
            "spare_worker_pid": scheduler.spare_worker_pid}


async def list_models(http: web.Request) -> web.Response:
    return web.json_response(_describe(http))


async def usage(http: web.Request) -> web.Response:
    """Per API key name (never the key): its limits, what it is using now, and its totals since the server
    started, overall and per model."""
    state = http.app[STATE]
    live, report = state.limits.live(), state.usage.report()
    policies = {policy.name: policy for policy in state.keys.policies}
    keys = {}
    for name in sorted(set(policies) | set(report)):
        policy = policies.get(name)
        limits = None
        if policy is not None:
            limits = {field: value for field, value in asdict(policy).items() if field not in ("name", "metrics")}
            limits["models"] = None if policy.models is None else sorted(policy.models)
            limits["priority"] = None if policy.priority is None else policy.priority.name.lower()
        now = live.get(name)
        keys[name] = {"limits": limits, "now": asdict(now) if now is not None else None,
                      **report.get(name, {"total": None, "models": {}})}
    return web.json_response({"keys": keys})


def _on_model(operation: Callable[[Scheduler, str], Awaitable[ModelSnapshot]]):
    """The handler of one operation on the model the path names (load, unload, pin, unpin): it answers the
    model's snapshot after it."""

    async def handler(http: web.Request) -> web.Response:
        snapshot = await operation(http.app[STATE].scheduler, http.match_info["model"])
        return web.json_response(asdict(snapshot))

    return handler


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/models", list_models)
    app.router.add_get("/admin/usage", usage)
    app.router.add_post("/admin/models/{model}/load", _on_model(lambda scheduler, model: scheduler.load(model)))
    app.router.add_post("/admin/models/{model}/unload", _on_model(lambda scheduler, model: scheduler.unload(model)))
    app.router.add_post("/admin/models/{model}/pin", _on_model(lambda scheduler, model: scheduler.pin(model, True)))
    app.router.add_post("/admin/models/{model}/unpin", _on_model(lambda scheduler, model: scheduler.pin(model, False)))
