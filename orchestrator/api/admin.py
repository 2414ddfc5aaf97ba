"""The admin API: see and steer model placement by hand, under the same ledger rules as requests."""

from __future__ import annotations

from dataclasses import asdict

from aiohttp import web

from orchestrator.api.state import STATE
from orchestrator.scheduler.observe import ModelSnapshot


def _model(model: ModelSnapshot, engines: dict) -> dict:
    """A model's snapshot, and what it simulates when it is a sim engine."""
    simulation = engines[model.name].manifest.simulation
    return {**asdict(model), "simulated": simulation is not None, "simulation": simulation and simulation.model_dump()}


def _describe(http: web.Request) -> dict:
    state = http.app[STATE]
    scheduler = state.scheduler
    ledger = scheduler.ledger
    return {
        "models": [_model(model, state.catalogue.engines) for model in scheduler.snapshot()],
        "devices": [asdict(device) for device in scheduler.device_memory()],
        "ledger": {
            "device": ledger.probe.name,
            "capacity_bytes": ledger.capacity,
            "reserve_bytes": ledger.reserve,
            "used_bytes": ledger.used,
            "free_bytes": ledger.free(),
        },
        "spare_worker": scheduler.workers.spare_state,
    }


async def list_models(http: web.Request) -> web.Response:
    return web.json_response(_describe(http))


async def load_model(http: web.Request) -> web.Response:
    snapshot = await http.app[STATE].scheduler.load(http.match_info["model"])
    return web.json_response(asdict(snapshot))


async def unload_model(http: web.Request) -> web.Response:
    snapshot = await http.app[STATE].scheduler.unload(http.match_info["model"])
    return web.json_response(asdict(snapshot))


async def pin_model(http: web.Request) -> web.Response:
    snapshot = await http.app[STATE].scheduler.pin(http.match_info["model"], True)
    return web.json_response(asdict(snapshot))


async def unpin_model(http: web.Request) -> web.Response:
    snapshot = await http.app[STATE].scheduler.pin(http.match_info["model"], False)
    return web.json_response(asdict(snapshot))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/models", list_models)
    app.router.add_post("/admin/models/{model}/load", load_model)
    app.router.add_post("/admin/models/{model}/unload", unload_model)
    app.router.add_post("/admin/models/{model}/pin", pin_model)
    app.router.add_post("/admin/models/{model}/unpin", unpin_model)
