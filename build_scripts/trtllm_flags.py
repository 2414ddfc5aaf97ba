"""The TensorRT-LLM 1.2 command-line flags the build planner may use, each with where it was read.

Source keys are those of the project's TensorRT-LLM 1.2 facts table ([sources] in
tests/trtllm/tensorrt_llm_1_2_facts.toml):
CONVERT = examples/models/core/llama/convert_checkpoint.py (the Qwen script takes the same flags),
QUANT = examples/quantization/quantize.py, BUILD = tensorrt_llm/commands/build.py (trtllm-build),
PLUGIN = tensorrt_llm/plugin/plugin.py (trtllm-build's plugin and feature flags).

The planner spells every flag through `flag()`, which refuses a flag or a value not listed here; the
tests hold the planner's output to this table, and this table to the facts table's [tools].
"""

from __future__ import annotations

from dataclasses import dataclass

CONVERT_TOOL = "convert_checkpoint.py"
QUANTIZE_TOOL = "quantize.py"
BUILD_TOOL = "trtllm-build"

_DTYPES = ("auto", "float16", "bfloat16", "float32")
_SWITCH = ("enable", "disable")  # trtllm-build's boolean features take these strings


@dataclass(frozen=True)
class FlagSpec:
    tool: str
    name: str  # e.g. --max_batch_size
    source: str  # the facts table's source key
    choices: tuple[str, ...] = ()  # the values it takes; empty: a number or a path


FLAGS: tuple[FlagSpec, ...] = (
    # Step 1a: Hugging Face checkpoint -> TensorRT-LLM checkpoint (16-bit)
    FlagSpec(CONVERT_TOOL, "--model_dir", "CONVERT"),
    FlagSpec(CONVERT_TOOL, "--output_dir", "CONVERT"),
    FlagSpec(CONVERT_TOOL, "--dtype", "CONVERT", _DTYPES),
    FlagSpec(CONVERT_TOOL, "--tp_size", "CONVERT"),
    FlagSpec(CONVERT_TOOL, "--pp_size", "CONVERT"),
    # Step 1b: FP8 through ModelOpt, calibrated on the GPU
    FlagSpec(QUANTIZE_TOOL, "--model_dir", "QUANT"),
    FlagSpec(QUANTIZE_TOOL, "--output_dir", "QUANT"),
    FlagSpec(QUANTIZE_TOOL, "--dtype", "QUANT", _DTYPES[1:]),
    FlagSpec(QUANTIZE_TOOL, "--qformat", "QUANT", ("fp8",)),
    FlagSpec(QUANTIZE_TOOL, "--kv_cache_dtype", "QUANT", ("fp8",)),
    FlagSpec(QUANTIZE_TOOL, "--calib_size", "QUANT"),
    FlagSpec(QUANTIZE_TOOL, "--calib_dataset", "QUANT"),
    FlagSpec(QUANTIZE_TOOL, "--tp_size", "QUANT"),
    # Step 2: trtllm-build
    FlagSpec(BUILD_TOOL, "--checkpoint_dir", "BUILD"),
    FlagSpec(BUILD_TOOL, "--output_dir", "BUILD"),
    FlagSpec(BUILD_TOOL, "--max_batch_size", "BUILD"),
    FlagSpec(BUILD_TOOL, "--max_input_len", "BUILD"),
    FlagSpec(BUILD_TOOL, "--max_seq_len", "BUILD"),
    FlagSpec(BUILD_TOOL, "--max_num_tokens", "BUILD"),
    FlagSpec(BUILD_TOOL, "--max_beam_width", "BUILD"),
    FlagSpec(BUILD_TOOL, "--kv_cache_type", "BUILD", ("paged",)),
    FlagSpec(BUILD_TOOL, "--workers", "BUILD"),
    FlagSpec(BUILD_TOOL, "--gpt_attention_plugin", "PLUGIN", (*_DTYPES, "disable")),
    FlagSpec(BUILD_TOOL, "--gemm_plugin", "PLUGIN", (*_DTYPES, "fp8", "disable")),
    FlagSpec(BUILD_TOOL, "--context_fmha", "PLUGIN", _SWITCH),
    FlagSpec(BUILD_TOOL, "--use_paged_context_fmha", "PLUGIN", _SWITCH),
    FlagSpec(BUILD_TOOL, "--use_fp8_context_fmha", "PLUGIN", _SWITCH),
    FlagSpec(BUILD_TOOL, "--remove_input_padding", "PLUGIN", _SWITCH),
    FlagSpec(BUILD_TOOL, "--tokens_per_block", "PLUGIN"),
    FlagSpec(BUILD_TOOL, "--use_fused_mlp", "PLUGIN", _SWITCH),
    FlagSpec(BUILD_TOOL, "--multiple_profiles", "PLUGIN", _SWITCH),
)

_BY_KEY = {(spec.tool, spec.name): spec for spec in FLAGS}


class UnknownFlag(ValueError):
    """The planner asked for a flag or value outside the table: a bug, never a user error."""


def flag(tool: str, name: str, value: object) -> tuple[str, str]:
    """`--name value` for `tool`, checked against the table; booleans become enable/disable."""
    spec = _BY_KEY.get((tool, name))
    if spec is None:
        raise UnknownFlag(f"{tool} {name} is not in the table of TensorRT-LLM 1.2 flags")
    text = ("enable" if value else "disable") if isinstance(value, bool) else str(value)
    if spec.choices and text not in spec.choices:
        raise UnknownFlag(f"{tool} {name} {text}: the value is not one of {', '.join(spec.choices)}")
    return name, text


def flags(tool: str, pairs: list[tuple[str, object]]) -> tuple[str, ...]:
    return tuple(token for name, value in pairs for token in flag(tool, name, value))
