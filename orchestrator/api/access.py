"""Which models a caller may see. A model its key may not use answers exactly as a model that does not exist
(404 model_not_found, listing only the models the key may use), as OpenAI does: a key never learns what
else the server holds."""

from __future__ import annotations

from aiohttp import web

from orchestrator.api.record import record_of
from orchestrator.api.state import STATE
from orchestrator.errors import ModelNotFound
from orchestrator.scheduler import ModelView


def visible_models(http: web.Request) -> list[str]:
    """The served models the caller's key may use, sorted."""
    caller = record_of(http).caller
    names = http.app[STATE].scheduler.model_names()
    return sorted(name for name in names if caller is None or caller.may_use(name))


def model_view(http: web.Request, model: str) -> ModelView:
    """The model's engine and settings, if the caller may use it; records the model on the request. Raises ModelNotFound
    (the same answer for a model the key may not use as for one that does not exist), or ModelUnavailable
    for an engine folder that was refused."""
    record = record_of(http)
    caller = record.caller
    if caller is not None and not caller.may_use(model):
        raise _not_found(model, visible_models(http))
    try:
        view = http.app[STATE].scheduler.model(model)
    except ModelNotFound:
        raise _not_found(model, visible_models(http)) from None
    record.model = model
    return view


def _not_found(model: str, visible: list[str]) -> ModelNotFound:
    return ModelNotFound(
        f"the model '{model:.200}' does not exist; models served here: {', '.join(visible) or 'none'}", param="model"
    )
