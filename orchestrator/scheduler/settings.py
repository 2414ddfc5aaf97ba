"""Per-model settings: a TOML file (`--model-settings models.toml`) over defaults from the config.

    [defaults]                 # for every model not named below
    keep_alive_s = 600

    [models.llama3-8b]
    pinned = true              # loaded at start, never evicted or unloaded for idleness
    max_concurrency = 64
    max_queue = 256
    priority = "interactive"   # or "batch": batch requests run only when no interactive one waits
    weight = 2.0               # share of the device-wide running cap when models compete
    kv_cache_bytes = 8_589_934_592
    max_tokens = 4096          # most tokens a choice may generate; the default for requests that give none
    generation_logits = true   # trtllm: gather each step's logits, for top_logprobs (pinned host RAM per request)
    generation_logits_bytes = 4_294_967_296  # trtllm: the pinned host RAM those requests' logits share
    prompt_cache_bytes = 17_179_869_184  # host RAM keeping reusable KV off the device (trtllm: pinned host tier)
    retain_system_prompt = true  # trtllm, sim: the system prompt and tools' KV blocks are evicted last
    special_tokens_in_content = true  # a message's `<|im_start|>` text is the control token (unsafe; default false)
"""

from __future__ import annotations

import tomllib
from enum import IntEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.config import ServerConfig
from orchestrator.errors import InvalidRequest


class Priority(IntEnum):
    """Higher runs first."""

    BATCH = 0
    INTERACTIVE = 1

    @classmethod
    def parse(cls, name: str) -> Priority:
        return cls[name.upper()]

    @property
    def in_engine(self) -> int:
        """EngineRequest.priority for this class: batch requests yield inside engines that schedule by
        priority too (TensorRT-LLM runs them at 0.25 against the default 0.5)."""
        return 0 if self is Priority.INTERACTIVE else -8


class ModelSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pinned: bool = False
    keep_alive_s: float = Field(-1, ge=-1, description="idle seconds before unloading; 0 at once, -1 never")
    max_concurrency: int | None = Field(None, ge=1, description="default: the engine's max batch size")
    max_queue: int | None = Field(None, ge=0)
    priority: str = Field("interactive", pattern="^(interactive|batch)$")
    weight: float = Field(1.0, gt=0)
    kv_cache_bytes: int | None = Field(None, ge=1, description="default: the engine manifest's budget")
    max_tokens: int | None = Field(
        None, ge=1, description="most tokens one choice may generate (400 above it), and the default when a "
        "request gives none (default: what the context leaves)",
    )

    generation_logits: bool | None = Field(
        None, description="trtllm: the executor gathers each step's logits, so top_logprobs works; costs a pinned "
        "host buffer of max_new_tokens x vocab logits per running request (default: the engine manifest's)",
    )
    generation_logits_bytes: int | None = Field(
        None, ge=1, description="trtllm, with generation_logits on: pinned host RAM held in the memory ledger while "
        "the model is loaded, from which each running top_logprobs request draws max_new_tokens x n x vocab_padded "
        "x 4 bytes (a request waits while the pool is full; one larger than the pool is refused) (default: one "
        "choice of the longest sequence, max_seq_len x vocab_padded x 4)",
    )

    prompt_cache_bytes: int | None = Field(
        None, ge=0, description="host RAM that keeps the model's reusable KV (prompt prefixes) once it leaves the "
        "device's cache: TensorRT-LLM's host KV tier (pinned, allocated at load), llama.cpp's RAM prompt cache; "
        "counted in the memory ledger (default: worker.prompt_cache_bytes; unset, trtllm and sim keep none and "
        "llamacpp half the KV cache budget)",
    )
    retain_system_prompt: bool = Field(
        False, description="trtllm, sim: keep the KV blocks of each request's system prompt and tool definitions "
        "(the prompt before the first user message) at high retention priority, so they are evicted last",
    )
    special_tokens_in_content: bool = Field(
        False, description="read special-token text inside messages and tools (a user's literal '<|im_start|>') "
        "as the special token itself, as chat templates alone do; off, it stays plain text, so no caller can "
        "write control tokens such as a fake system turn (text/literal_specials.py)",
    )

    @property
    def priority_class(self) -> Priority:
        return Priority.parse(self.priority)


class SettingsError(Exception):
    pass


def load_model_settings(config: ServerConfig, names: list[str]) -> dict[str, ModelSettings]:
    """Settings for every model: file entries over the file's [defaults] over the server config."""
    base = {"keep_alive_s": config.scheduling.keep_alive_s, "max_queue": config.scheduling.max_queue,
            "max_tokens": config.scheduling.max_tokens, "kv_cache_bytes": config.worker.kv_cache_bytes,
            "prompt_cache_bytes": config.worker.prompt_cache_bytes}
    models: dict = {}
    if config.model_settings is not None:
        try:
            raw = tomllib.loads(config.model_settings.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"{config.model_settings}: {exc}") from exc
        base.update(raw.get("defaults", {}))
        models = raw.get("models", {})
        unknown = sorted(set(models) - set(names))
        if unknown:
            raise SettingsError(f"{config.model_settings}: settings for models with no engine: {', '.join(unknown)}")
    try:
        return {name: ModelSettings(**{**base, **models.get(name, {})}) for name in names}
    except ValidationError as exc:
        raise SettingsError(f"model settings: {exc}") from exc


def request_priority(service_tier: str | None, default: Priority, key_class: Priority | None = None) -> Priority:
    """A request's class from OpenAI's `service_tier`: "flex" asks for batch treatment, "priority" for
    interactive; without one, the API key's class if it has one, else `default` (the model's). A key's class
    is also the best its requests get: a batch key's requests run as batch whatever they ask."""
    if service_tier in (None, "auto", "default"):
        asked = default if key_class is None else key_class
    elif service_tier == "flex":
        asked = Priority.BATCH
    elif service_tier == "priority":
        asked = Priority.INTERACTIVE
    else:
        raise InvalidRequest(f"service_tier must be auto, default, flex or priority (got {service_tier!r})",
                             param="service_tier")
    return asked if key_class is None else min(asked, key_class)
