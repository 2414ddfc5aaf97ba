"""Each backend's own option section: the knobs it reads, validated by its own pydantic model.

The server's settings name these knobs once, as users type them (`--worker.device`, `--worker.threads`,
`--worker.capacity-policy`; orchestrator/config.py declares those keys with the types below). A model's load
carries only its backend's section (`LoadSpec.options`), made from those settings by `options_for`: a backend's
option `x` is the server's `worker.x`, and settings the backend has no option for are not part of its section.
Some options are per model instead, from the model's settings (placement adds them): trtllm's `generation_logits`,
and for trtllm, sim and llamacpp the host KV tier (`prompt_cache_bytes`, resolved to bytes by `prompt_cache_budget`)
and `retain_system_prompt`.
The worker hands the section to the backend (`BackendSettings.options`), which reads its own fields and no
other backend's.

Imported by the HTTP process too (config, placement, the load message): nothing here imports a runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ModelUnavailable

# Each knob's type and bounds, declared once: the server's settings and the backends' sections both use them.
Device = Annotated[Literal["auto", "cpu", "cuda"], Field(description="auto picks cuda when torch sees a GPU")]
Threads = Annotated[int | None, Field(ge=1, description="CPU threads (None: the backend's default)")]
PromptCacheBytes = Annotated[
    int | None,
    Field(ge=0, description="host RAM that keeps reusable KV (prompt prefixes) after it leaves the device's cache: "
          "llamacpp's RAM prompt cache, TensorRT-LLM's host KV tier (None: llamacpp half the KV cache budget, "
          "trtllm and sim none; 0: none)"),
]
# llama.cpp's RAM prompt cache, when the setting is not given: this share of the model's KV budget again.
LLAMACPP_PROMPT_CACHE_SHARE = 0.5
# Retention priority of the system prompt's blocks with `retain_system_prompt` (TensorRT-LLM: 0 to 100, default 35;
# blocks below 30 are never offloaded to the host tier). High, not the maximum, so a request may still outrank it.
SYSTEM_PROMPT_PRIORITY = 90
CapacityPolicy = Annotated[
    Literal["guaranteed_no_evict", "max_utilization"],
    Field(description="TensorRT-LLM's capacity scheduler: admit only what can finish, or fill the KV cache and pause"),
]


class BackendOptions(BaseModel):
    """One backend's section. `backend` names the backend it belongs to (the manifest's `backend`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backend: ClassVar[str]


class HfOptions(BackendOptions):
    backend: ClassVar[str] = "hf"
    device: Device = "auto"
    threads: Threads = None  # torch's intra-op threads (None: torch's default, every core)


class LlamaCppOptions(BackendOptions):
    backend: ClassVar[str] = "llamacpp"
    threads: Threads = None  # llama.cpp's threads for every step (None: learned per step size, llamacpp/threads.py)
    prompt_cache_bytes: PromptCacheBytes = None  # the RAM prompt cache (llama-server's --cache-ram)


class TrtllmOptions(BackendOptions):
    backend: ClassVar[str] = "trtllm"
    capacity_policy: CapacityPolicy = "guaranteed_no_evict"
    # ExecutorConfig.gather_generation_logits, from the model's own setting (ModelSettings.generation_logits)
    generation_logits: bool = False
    # KvCacheConfig.host_cache_size: pinned host RAM for offloaded reusable KV blocks (None or 0: no host tier)
    prompt_cache_bytes: PromptCacheBytes = None
    # Each request's system prompt and tools at SYSTEM_PROMPT_PRIORITY (KvCacheRetentionConfig): the model's setting
    retain_system_prompt: bool = False


class SimOptions(BackendOptions):
    """The simulator takes the policy a TensorRT-LLM engine would, and refuses the one it does not simulate."""

    backend: ClassVar[str] = "sim"
    capacity_policy: CapacityPolicy = "guaranteed_no_evict"
    prompt_cache_bytes: PromptCacheBytes = None  # the simulated host KV tier, as trtllm's
    retain_system_prompt: bool = False


OPTIONS: dict[str, type[BackendOptions]] = {
    model.backend: model for model in (HfOptions, LlamaCppOptions, TrtllmOptions, SimOptions)
}


def prompt_cache_budget(backend: str, given: int | None, kv_cache_bytes: int) -> int:
    """The host RAM a model's prompt cache takes, in bytes: the setting when given, else llamacpp's default (a share
    of its KV budget; that cache grows as requests finish) and none for trtllm and sim (their host tier is pinned
    memory allocated whole at load, which takes seconds: it is asked for, never assumed). 0 for backends without
    one (hf)."""
    if "prompt_cache_bytes" not in OPTIONS[backend].model_fields:
        return 0
    if given is not None:
        return given
    return int(kv_cache_bytes * LLAMACPP_PROMPT_CACHE_SHARE) if backend == "llamacpp" else 0


def options_model(backend: str) -> type[BackendOptions]:
    """The section model of `backend`; ModelUnavailable for a backend this server does not know."""
    model = OPTIONS.get(backend)
    if model is None:
        raise ModelUnavailable(f"backend must be one of {', '.join(sorted(OPTIONS))} (got {backend!r})")
    return model


def parse_options(backend: str, section: Mapping[str, object]) -> BackendOptions:
    """`section` checked by `backend`'s model: ModelUnavailable naming the first field that is wrong (an unknown
    field included) and the value given."""
    model = options_model(backend)
    try:
        return model.model_validate(dict(section))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or backend
        raise ModelUnavailable(
            f"{backend} option {field}: {first['msg']} (got {first.get('input')!r:.80})", param=field
        ) from None


def options_for(backend: str, settings: Mapping[str, object]) -> BackendOptions:
    """`backend`'s section from the server's worker settings (`WorkerConfig.model_dump()`, or any mapping of
    the same names): the fields the backend declares, each from the setting of the same name when given."""
    model = options_model(backend)
    return parse_options(backend, {name: settings[name] for name in model.model_fields if name in settings})


def unread_settings(given: Iterable[str], backends: Iterable[str]) -> dict[str, list[str]]:
    """Of the worker settings a user gave (`given`, their field names), each backend knob that none of
    `backends` (those of the engines served) reads, with the backends that would read it. A knob nobody reads
    would be silently ignored, so the server refuses to start with it."""
    served = set(backends)
    unread = {}
    for name in sorted(given):
        readers = sorted(backend for backend, model in OPTIONS.items() if name in model.model_fields)
        if readers and not served.intersection(readers):
            unread[name] = readers
    return unread
