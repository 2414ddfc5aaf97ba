"""The engine manifest (`engine.json`): what the AOT build promises the server about an engine folder.

The build writes it last, into a complete folder; the server reads it before anything else and refuses
a folder whose manifest is missing or disagrees with the folder, saying what to rebuild.

Schema version 1 grows only by optional fields with defaults, so every engine built before a field was
added still loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MANIFEST_FILE = "engine.json"
SCHEMA_VERSION = 1
Backend = Literal["hf", "trtllm", "sim", "llamacpp"]
# What the folder holds. hf: safetensors weights for transformers; trtllm: TensorRT engines (rank*.engine)
# for the Executor; sim: a simulated engine's parameters (sim.json), no weights; gguf: one model.gguf for
# llama.cpp. A later TensorRT-LLM target, a prepared checkpoint for the LLM API's PyTorch backend, would be one
# more value here (see docs/building.md).
EngineFormat = Literal["hf-safetensors", "trt-engine", "sim-config", "gguf"]
IMPLIED_FORMAT: dict[str, EngineFormat] = {
    "hf": "hf-safetensors", "trtllm": "trt-engine", "sim": "sim-config", "llamacpp": "gguf"
}
BACKEND_FORMATS: dict[str, tuple[EngineFormat, ...]] = {"hf": ("hf-safetensors",), "trtllm": ("trt-engine",),
                                                        "sim": ("sim-config",), "llamacpp": ("gguf",)}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelFacts(_Frozen):
    recipe: str  # catalogue entry the engine was built from
    architecture: str  # e.g. LlamaForCausalLM
    source: str  # where the weights came from (checkpoint path, wheel)
    parameters: int = Field(ge=0)


class Limits(_Frozen):
    max_batch_size: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_seq_len: int = Field(ge=2)  # prompt + generated tokens
    max_num_tokens: int = Field(ge=1)  # tokens in one engine step (prefill chunk + decodes)

    @model_validator(mode="after")
    def _consistent(self) -> Limits:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(f"max_input_len {self.max_input_len} must be below max_seq_len {self.max_seq_len}")
        return self


class Parallelism(_Frozen):
    tp_size: int = Field(1, ge=1)
    pp_size: int = Field(1, ge=1)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


class TokenizerFacts(_Frozen):
    eos_token_ids: tuple[int, ...] = Field(min_length=1)  # all of them end a sequence
    pad_token_id: int
    bos_token_id: int | None = None
    has_chat_template: bool


class KvCacheFacts(_Frozen):
    tokens_per_block: int = Field(ge=1)
    bytes_per_token: int = Field(ge=1)  # K and V, all layers, per sequence token
    default_budget_bytes: int = Field(ge=1)  # used unless the server assigns another budget
    dtype: str | None = None  # element type of the cache when it is not the model's dtype (e.g. "fp8")


class GenerationDefaults(_Frozen):
    """Sampling used when a request leaves a field out (the model card's recommendation)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)


class SimulationFacts(_Frozen):
    """A simulated engine (backend "sim"): what it stands for. Its sizes elsewhere in the manifest (weights_bytes,
    kv_cache) are the simulated GPU's; its step-time parameters are in the folder's sim.json."""

    gpu: str  # the simulated GPU, e.g. "h100-sxm" (orchestrator/engine/gpus.py)
    gpu_count: int = Field(1, ge=1)  # GPUs the engine spans (its tensor-parallel size)
    precision: Literal["fp8", "bf16"]  # weights and KV cache
    speedup: float = Field(1.0, gt=0)  # simulated time runs this many times faster than the GPU's
    tokenizer: Literal["model", "stand-in"]  # the model's own tokenizer, or a stand-in with other token ids
    tokenizer_source: str  # where the tokenizer files came from

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        from orchestrator.engine.gpus import find_gpu

        find_gpu(gpu)  # ValueError naming the GPUs this version simulates
        return gpu


class ChatFormat(_Frozen):
    """How the model writes tool calls and thinking (the recipe says, per model family)."""

    tool_call_format: Literal["hermes", "llama3_json", "mistral"] | None = None  # None: hermes, taught by a prompt
    reasoning_format: Literal["deepseek_r1", "qwen3"] | None = None  # None: the model does not think aloud


class BuildInfo(_Frozen):
    fingerprint: str  # digest of every build input: recipe, checkpoint identity, tool versions, target
    built_at: str  # ISO 8601, UTC
    duration_s: float = Field(ge=0)
    tools: dict[str, str]  # versions of what built it: transformers, torch, tensorrt_llm, tensorrt
    target_arch: str  # "sm90" for a TensorRT engine, "any" for portable hf engines
    gpu_name: str | None = None
    compute_capability: str | None = None  # "9.0"
    rebuild: str | None = None  # the command that rebuilds this engine, shown when the server refuses it
    steps: tuple[str, ...] = ()  # the build's steps as run, external commands spelled out in full


class EngineManifest(_Frozen):
    schema_version: int = SCHEMA_VERSION
    name: str
    backend: Backend
    format: EngineFormat | None = None  # None: the backend's only format (IMPLIED_FORMAT)
    model: ModelFacts
    dtype: str
    quantization: str | None = None
    limits: Limits
    parallel: Parallelism = Parallelism()
    tokenizer: TokenizerFacts
    kv_cache: KvCacheFacts
    weights_bytes: int = Field(ge=0)
    generation_defaults: GenerationDefaults = GenerationDefaults()
    # trtllm: the executor gathers each step's logits (needed for top_logprobs). A runtime setting in 1.2, no build
    # flag: this is the default that the model's `generation_logits` setting overrides.
    generation_logits: bool = False
    chat: ChatFormat = ChatFormat()
    build: BuildInfo
    simulation: SimulationFacts | None = None  # backend "sim" only

    @property
    def engine_format(self) -> EngineFormat:
        return self.format or IMPLIED_FORMAT[self.backend]

    @model_validator(mode="after")
    def _format_fits_backend(self) -> EngineManifest:
        if self.engine_format not in BACKEND_FORMATS[self.backend]:
            raise ValueError(f"the {self.backend} backend cannot serve the {self.engine_format} format")
        if (self.backend == "sim") != (self.simulation is not None):
            raise ValueError("a sim engine, and only a sim engine, states its simulation facts")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


class EngineRefused(Exception):
    """An engine folder the server will not serve, with the reason and how to fix it.

    `rebuild` is the command recorded by the build (manifest.build.rebuild) where known.
    """

    def __init__(self, folder: Path, reason: str, rebuild: str | None = None):
        self.folder = folder
        self.reason = reason
        self.rebuild = rebuild or f"make build-engine MODEL={folder.name}"
        super().__init__(f"{folder}: {reason} (rebuild with: {self.rebuild})")


# Files each format needs in the folder beside engine.json.
def required_files(manifest: EngineManifest) -> list[str]:
    files = ["tokenizer.json"]
    if manifest.engine_format == "hf-safetensors":
        files += ["config.json", "model.safetensors"]
    elif manifest.engine_format == "sim-config":
        files += ["sim.json"]
    elif manifest.engine_format == "gguf":
        files += ["model.gguf"]
    else:
        files += ["config.json"] + [f"rank{rank}.engine" for rank in range(manifest.parallel.world_size)]
    return files


def weight_files(manifest: EngineManifest) -> list[str]:
    """The files the backend reads its weights from (what host RAM keeps for a model's next load): the GGUF file for
    llama.cpp, the safetensors file for transformers, each rank's engine for TensorRT-LLM; none for a sim engine,
    whose weights are simulated."""
    if manifest.engine_format == "sim-config":
        return []
    return [name for name in required_files(manifest) if name.endswith((".gguf", ".safetensors", ".engine"))]


def _recorded_rebuild(folder: Path, raw) -> str | None:
    """The rebuild command a readable manifest recorded, if it was built under this folder's name."""
    if not isinstance(raw, dict) or raw.get("name") != folder.name or not isinstance(raw.get("build"), dict):
        return None
    command = raw["build"].get("rebuild")
    return command if isinstance(command, str) else None


def load_manifest(folder: Path) -> EngineManifest:
    """Read and check a folder's manifest; raise EngineRefused saying what is wrong."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise EngineRefused(folder, f"{MANIFEST_FILE} is missing (an interrupted or foreign build)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineRefused(folder, f"{MANIFEST_FILE} is unreadable: {exc}") from exc
    rebuild = _recorded_rebuild(folder, raw)
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        found = raw.get("schema_version") if isinstance(raw, dict) else None
        raise EngineRefused(folder, f"{MANIFEST_FILE} has schema_version {found!r}, expected {SCHEMA_VERSION}")
    try:
        manifest = EngineManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EngineRefused(folder, f"{MANIFEST_FILE} is invalid at {where}: {first['msg']}", rebuild) from exc
    if manifest.name != folder.name:
        raise EngineRefused(folder, f"{MANIFEST_FILE} names the engine {manifest.name!r}, not {folder.name!r}")
    missing = [name for name in required_files(manifest) if not (folder / name).is_file()]
    if missing:
        raise EngineRefused(
            folder, f"files listed by the {manifest.backend} backend are missing: {', '.join(missing)}", rebuild
        )
    return manifest
