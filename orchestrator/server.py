"""Running the server: listen, load the models, say "ready", and on SIGINT/SIGTERM drain and stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web

from orchestrator import aio
from orchestrator.access.keys import KeysError
from orchestrator.api.app import build_app, runner_options
from orchestrator.api.state import STATE
from orchestrator.backends.options import unread_settings
from orchestrator.config import ServerConfig
from orchestrator.engine.catalogue import discover
from orchestrator.scheduler import FAREWELL_S, MixedEngines, SettingsError

log = logging.getLogger("inferno")


async def serve(config: ServerConfig) -> int:
    catalogue = discover(config.engines_dir, config.models)
    if not catalogue.engines:
        problems = "; ".join(str(e) for e in catalogue.refused.values()) or f"no engine folders in {config.engines_dir}"
        log.error("nothing to serve: %s. Build one with: make build-engine MODEL=smollm2-135m", problems)
        return 2
    backends = {name: engine.manifest.backend for name, engine in catalogue.engines.items()}
    unread = unread_settings(config.worker.model_fields_set, backends.values())
    if unread:
        served = ", ".join(f"{name}: {backend}" for name, backend in backends.items())
        for name, readers in unread.items():
            log.error("cannot start: --worker.%s is read only by the %s backend%s, and no engine served here uses "
                      "one (%s); leave it out", name.replace("_", "-"), " and ".join(readers),
                      "s" if len(readers) > 1 else "", served)
        return 2
    try:
        app = build_app(config, catalogue)
    except MixedEngines as exc:
        log.error("cannot serve these engines together: %s", exc)
        return 2
    except (KeysError, SettingsError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that goes away cancels its handler, and so its engine requests
        access_log=log if config.log_level == "debug" else None,
        shutdown_timeout=FAREWELL_S,  # the scheduler's drain has run by then: handlers are finishing
        **runner_options(config),
    )
    await runner.setup()  # starts the scheduler: its initial loads begin
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    host, port = runner.addresses[0][:2]
    log.info("listening on http://%s:%d, loading %d model(s)", host, port, len(catalogue.engines))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    state = app[STATE]
    loading = state.initial_loads  # started with the app (its cleanup context), cancelled when it shuts down
    # What each model's first prompt would otherwise make on the event loop, made on a thread while they load.
    warming = asyncio.create_task(asyncio.to_thread(lambda: [e.prompts.warm() for e in catalogue.engines.values()]))
    await asyncio.wait([loading, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if loading.done():
        await warming
        states = ", ".join(f"{m.name} ({m.backend}, {m.state})" for m in state.scheduler.snapshot())
        aio.settle_heap()
        print(f"Inferno ready: http://{host}:{port}/v1 serving {states}", flush=True)
        await stop.wait()
    log.info("shutting down: draining requests for up to %.0f s", config.drain_timeout_s)
    # Still listening: /ready says 503 at once, new requests get 503 with Retry-After, running ones finish until
    # the deadline and are then ended with an error. Then the listener closes and the workers stop.
    await state.scheduler.drain(config.drain_timeout_s)
    await runner.cleanup()
    return 0


def run(config: ServerConfig) -> int:
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return aio.run(serve(config))
