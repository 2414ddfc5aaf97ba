"""Backends by name. Each is imported only inside a worker process, and only when selected, so the HTTP
process never loads torch or TensorRT-LLM and a missing runtime fails that model's load, not the server."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from orchestrator.engine.manifest import EngineManifest

if TYPE_CHECKING:  # protocol.py imports the worker's messages, which import backends/options.py: no cycle at run time
    from orchestrator.backends.protocol import Backend, BackendSettings

_MODULES = {"hf": "orchestrator.backends.hf.backend", "trtllm": "orchestrator.backends.trtllm.backend",
            "sim": "orchestrator.backends.sim.backend", "llamacpp": "orchestrator.backends.llamacpp.backend"}


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
    """What a backend can honour beyond what every backend must (max_tokens, stop strings and stop tokens,
    ignore_eos, min_tokens, seeds, n), so the HTTP layer can refuse the rest with a clear 400 up front."""

    penalties: bool  # presence, frequency and repetition penalties
    logprobs: bool  # the chosen token's log probability (EngineRequest.logprobs -> TokenDelta.logprobs)
    top_logprobs: bool  # the most likely alternatives too (EngineRequest.top_logprobs)
    logit_bias: bool
    min_p: bool
    guided: bool = True  # output constraints (structured outputs, forced tool calls) enforced by a grammar
    top_logprobs_note: str = ""  # why top_logprobs is refused, when it depends on how the engine was built
    retention: bool = False  # keeps a request's system prompt longer in its KV cache (system_prefix_tokens)


_FEATURES = {
    "hf": Features(penalties=True, logprobs=True, top_logprobs=True, logit_bias=True, min_p=True),
    "trtllm": Features(penalties=True, logprobs=True, top_logprobs=False, logit_bias=True, min_p=True,
                       retention=True),
    # Synthetic text: log probabilities are synthetic but deterministic (orchestrator/backends/sim/sequence.py); logit_bias
    # and penalties have no meaning for it and are refused. top_p, top_k and min_p are accepted and change
    # nothing: the simulator's text does not come from a distribution.
    "sim": Features(penalties=False, logprobs=True, top_logprobs=True, logit_bias=False, min_p=True, guided=False,
                    retention=True),
    "llamacpp": Features(penalties=True, logprobs=True, top_logprobs=True, logit_bias=True, min_p=True),
}
_TRTLLM_WITH_LOGITS = replace(_FEATURES["trtllm"], top_logprobs=True)
_NO_GENERATION_LOGITS = (
    "they are computed from each step's logits, which this model's TensorRT-LLM executor does not gather; "
    "turn on the model's generation_logits setting (--model-settings; it costs pinned host memory per "
    "request, docs/tensorrt-llm.md)"
)


def features_of(manifest: EngineManifest) -> Features:
    """What the model's backend honours; for trtllm, `manifest.generation_logits` is the served value (the model's
    setting over the manifest's, scheduler/entries.py)."""
    if manifest.backend == "trtllm":
        if manifest.generation_logits:
            return _TRTLLM_WITH_LOGITS
        return replace(_FEATURES["trtllm"], top_logprobs_note=_NO_GENERATION_LOGITS)
    return _FEATURES[manifest.backend]
