"""What a simulated engine is made of: its recipe, the user's --quant, --tp and --sim-* options, and the
defaults of the simulator (orchestrator/backends/sim/), turned into the numbers its sim.json and engine.json hold.

Every number can be set with `--sim-param NAME=VALUE` (see PARAMETERS); the step-time parameters default to
the calibrated fit carried over to the model and GPU (step_time.derive), the sizes to the model's memory
arithmetic (orchestrator/backends/sim/memory.py), and the limits and KV block size to the recipe's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import ValidationError

from build_scripts.catalogue import RecipeError
from build_scripts.spec import BuildOptions, BuildSpec
from orchestrator.backends.sim import memory
from orchestrator.backends.sim.spec import INIT_S, SimSpec
from orchestrator.backends.sim.step_time import (
    REFERENCE_PARAMETERS,
    REFERENCE_SHAPE,
    StepCoefficients,
    derive,
)
from orchestrator.engine.gpus import DEFAULT_GPU, SimGpu, find_gpu
from orchestrator.engine.manifest import Limits

NATURAL_LENGTH = 256  # mean answer length of requests that may end on an end token [I]
LOAD_BYTES_S = 2e9  # reading the engine's weights from disk to the GPU [I]

STEP = ("a_ms", "b_ms", "c_ms_per_mtok", "e_tok_per_ms", "q_ms_per_tok2")
LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
# NAME -> its type. Step time, load_s, init_s, host_link_bytes_s, natural_length, kv_tokens and runtime_overhead_bytes go to sim.json;
# weights_bytes, kv_cache_bytes (the default budget), tokens_per_block and the limits to engine.json.
PARAMETERS: dict[str, type] = {
    **dict.fromkeys(STEP, float),
    "load_s": float,
    "init_s": float,
    "host_link_bytes_s": float,
    "natural_length": int,
    "kv_tokens": int,
    "runtime_overhead_bytes": int,
    "weights_bytes": int,
    "kv_cache_bytes": int,
    "tokens_per_block": int,
    **dict.fromkeys(LIMITS, int),
}
PARAMETERS_HELP = (
    f"the step time ({', '.join(STEP)}); load_s, init_s, host_link_bytes_s (per GPU), natural_length, kv_tokens (KV capacity override), "
    f"runtime_overhead_bytes, weights_bytes, kv_cache_bytes (default KV budget), tokens_per_block; the limits "
    f"({', '.join(LIMITS)}). See docs/simulation.md"
)
POSITIVE = {"e_tok_per_ms", "host_link_bytes_s", "natural_length", "kv_tokens", "tokens_per_block", *LIMITS}


@dataclass(frozen=True)
class SimBuild:
    gpu: SimGpu
    precision: memory.Precision
    speedup: float
    limits: Limits
    tokens_per_block: int
    kv_bytes_per_token: int
    weights_bytes: int
    default_budget_bytes: int
    spec: SimSpec
    settings: dict  # the parameters set with --sim-param, for the fingerprint


def parse_params(items: tuple[str, ...]) -> dict[str, int | float]:
    """`NAME=VALUE` strings as typed values; RecipeError naming what is wrong."""
    values: dict[str, int | float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in PARAMETERS:
            raise RecipeError(f"--sim-param {item!r}: expected NAME=VALUE, NAME one of {', '.join(PARAMETERS)}")
        kind = PARAMETERS[name]
        try:
            number = float(text)
            value = kind(number)
        except (ValueError, OverflowError):
            number = value = None
        if value is None or value != number or not math.isfinite(value):
            raise RecipeError(f"--sim-param {item!r}: {name} takes {'an integer' if kind is int else 'a number'}")
        if value < 0 or (value == 0 and name in POSITIVE):
            raise RecipeError(f"--sim-param {item!r}: {name} must be {'positive' if name in POSITIVE else 'at least 0'}")
        values[name] = value
    return values


def _limits(spec: BuildSpec, params: dict) -> Limits:
    try:
        return Limits(**{**spec.recipe.limits.model_dump(), **{k: params[k] for k in LIMITS if k in params}})
    except ValidationError as exc:
        raise RecipeError(f"--sim-param: {exc.errors()[0]['msg']}") from None


def _step(spec: BuildSpec, gpu: SimGpu, precision: memory.Precision, params: dict) -> tuple[StepCoefficients, bool]:
    recipe = spec.recipe
    step = derive(precision, recipe.shape, recipe.parameters, gpu, spec.tp_size)
    overridden = {name: params[name] for name in STEP if name in params}
    reference = recipe.shape == REFERENCE_SHAPE and recipe.parameters == REFERENCE_PARAMETERS and spec.tp_size == 1
    return step.model_copy(update=overridden), gpu.calibrated and reference and not overridden


def sim_build(spec: BuildSpec, options: BuildOptions) -> SimBuild:
    """Every number of the engine; RecipeError when the options make no sense or the model does not fit."""
    recipe, params = spec.recipe, parse_params(options.sim_params)
    try:
        gpu = find_gpu(options.sim_gpu or DEFAULT_GPU)
    except ValueError as exc:
        raise RecipeError(f"--sim-gpu: {exc}") from None
    if options.sim_speedup is not None and options.sim_speedup <= 0:
        raise RecipeError(f"--sim-speedup must be positive (got {options.sim_speedup:g})")
    precision: memory.Precision = spec.quant or "bf16"
    limits = _limits(spec, params)
    tokens_per_block = params.get("tokens_per_block", recipe.kv_cache.tokens_per_block)
    per_token = memory.kv_bytes_per_token(recipe.shape, precision)
    weights = params.get("weights_bytes", memory.weights_bytes(recipe.parameters, recipe.shape, precision))
    overhead = params.get(
        "runtime_overhead_bytes", memory.runtime_overhead_bytes(recipe.shape, limits.max_num_tokens, spec.tp_size)
    )
    device = gpu.memory_bytes * spec.tp_size
    budget = params.get("kv_cache_bytes", memory.default_kv_budget(device, weights, overhead))
    if budget < per_token * tokens_per_block:
        raise RecipeError(
            f"{recipe.name} in {precision} does not fit {spec.tp_size} simulated {gpu.name} GPU(s): {weights / 1e9:.1f} GB "
            f"of weights and {overhead / 1e9:.1f} GB of overhead leave no KV cache within 90% of {device / 1e9:.1f} GB "
            f"(use a larger --tp, --quant fp8, another --sim-gpu, or set kv_cache_bytes)"
        )
    step, calibrated = _step(spec, gpu, precision, params)
    sim_spec = SimSpec(
        step=step,
        calibrated=calibrated,
        runtime_overhead_bytes=overhead,
        kv_tokens=params.get("kv_tokens"),
        load_s=params.get("load_s", INIT_S + weights / LOAD_BYTES_S),
        init_s=params.get("init_s", INIT_S),
        host_link_bytes_s=params.get("host_link_bytes_s", gpu.host_link_bytes_s),
        natural_length=params.get("natural_length", NATURAL_LENGTH),
    )
    return SimBuild(
        gpu, precision, options.sim_speedup or 1.0, limits, tokens_per_block, per_token, weights, budget, sim_spec,
        params,
    )
