"""Backends by name. Each is imported only inside a worker process, and only when selected, so the HTTP
process never loads torch or TensorRT-LLM and a missing runtime fails that model's load, not the server."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from orchestrator.backends.protocol import Backend, BackendSettings
from orchestrator.engine.manifest import EngineManifest

_MODULES = {
    "hf": "orchestrator.backends.hf",
    "trtllm": "orchestrator.backends.trtllm",
    "sim": "orchestrator.backends.sim",
}


def preload_backends(names: tuple[str, ...]) -> None:
    """Import these backends' runtimes ahead of any load (a spare worker does this while it waits).
    A runtime that is missing is skipped here: the load that needs it reports it."""
    for name in names:
        try:
            module = importlib.import_module(_MODULES[name])
            getattr(module, "preload", lambda: None)()
        except (ImportError, KeyError):
            pass


def create_backend(settings: BackendSettings) -> Backend:
    """The backend the engine's manifest names. Raises errors.BackendUnavailable if its runtime is missing."""
    module = importlib.import_module(_MODULES[settings.manifest.backend])
    return module.create(settings)


@dataclass(frozen=True)
class Features:
    """What a backend can honour, so the HTTP layer can refuse the rest with a clear 400 up front."""

    penalties: bool  # presence_penalty / frequency_penalty
    logprobs: bool = False  # per-token log probabilities (EngineRequest.logprobs -> TokenDelta.logprobs)


_FEATURES = {
    "hf": Features(penalties=False),
    "trtllm": Features(penalties=True, logprobs=True),
    # Synthetic text: log probabilities are synthetic but deterministic (orchestrator/sim/sequence.py); logit_bias
    # and penalties have no meaning for it and are refused.
    "sim": Features(penalties=False, logprobs=True),
}


def features_of(manifest: EngineManifest) -> Features:
    return _FEATURES[manifest.backend]
