"""`inferno build` and `inferno models catalogue`.

The only place the build reads environment variables (INFERNO_ENGINES_DIR, INFERNO_RECIPES_DIR,
INFERNO_TRTLLM_EXAMPLES, the Hugging Face cache and hub variables (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE),
CUDA_VISIBLE_DEVICES); everything below receives plain values.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from build_scripts.catalogue import RecipeError, find_recipe, load_catalogue
from build_scripts.catalogue_view import render_catalogue
from build_scripts.environment import probe
from build_scripts.fetch import DEFAULT_ENDPOINT, FetchError, Hub, fetch
from build_scripts.gguf_engine import plan_gguf
from build_scripts.hf_engine import plan_hf
from build_scripts.plan import Plan
from build_scripts.preflight import PreflightError, preflight
from build_scripts.runner import INTERRUPTED, is_up_to_date, run_plan
from build_scripts.sim_engine import plan_sim
from build_scripts.sim_params import PARAMETERS_HELP
from build_scripts.sources import Checkpoint, after_fetch, hf_hub_cache, resolve_or_fetch
from build_scripts.spec import DEFAULT_EXAMPLES, BuildOptions, BuildSpec, resolve_spec
from build_scripts.trtllm_engine import plan_trtllm
from orchestrator.engine.gpus import DEFAULT_GPU, GPUS

PLANNERS = {"hf": plan_hf, "llamacpp": plan_gguf, "sim": plan_sim, "trtllm": plan_trtllm}  # by the recipe's backend


def _recipe_dirs(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Path, ...]:
    folder = args.recipes_dir or env.get("INFERNO_RECIPES_DIR")
    return (Path(folder),) if folder else ()


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferno build", description="Build an engine ahead of time.")
    parser.add_argument("model", help="a catalogue name (see: inferno models catalogue)")
    parser.add_argument("--checkpoint", type=Path, help="local checkpoint folder, or a .gguf file for llamacpp "
                        "recipes (default: the recipe's source)")
    parser.add_argument(
        "--quant", help="a quantisation the recipe allows, e.g. fp8 (default: none); for a -sim model its "
        "precision: fp8 (default) or bf16"
    )
    parser.add_argument("--tp", type=int, help="tensor-parallel size, one GPU per rank (default: the recipe's)")
    parser.add_argument("--arch", help="target GPU architecture, e.g. sm90 (default: the recipe's)")
    parser.add_argument("--name", help="engine folder name (default: the model name)")
    parser.add_argument("--engines-dir", type=Path, default=Path(env.get("INFERNO_ENGINES_DIR", "engines")))
    parser.add_argument("--recipes-dir", type=Path, help="extra folder of recipe .toml files")
    parser.add_argument(
        "--trtllm-examples",
        type=Path,
        default=Path(env.get("INFERNO_TRTLLM_EXAMPLES", DEFAULT_EXAMPLES)),
        help=f"TensorRT-LLM's examples/ folder (default: {DEFAULT_EXAMPLES}, as in the official container)",
    )
    parser.add_argument("--calib-dataset", help="FP8 calibration dataset: a local folder on air-gapped sites")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and what preflight finds, then exit")
    parser.add_argument("--force", action="store_true", help="rebuild even if the engine is up to date")
    parser.add_argument("--offline", action="store_true", help="never download a checkpoint (also: HF_HUB_OFFLINE=1); "
                        "by default one that is neither given nor cached is fetched from the hub (HF_ENDPOINT, HF_TOKEN)")
    _sim_arguments(parser)
    return parser


def _sim_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "simulated engines (<model>-sim: no GPU, no checkpoint; see docs/simulation.md)"
    )
    group.add_argument("--sim-gpu", choices=sorted(GPUS), help=f"the GPU simulated (default: {DEFAULT_GPU})")
    group.add_argument(
        "--sim-speedup", type=float, help="simulated time runs this many times faster than the GPU's (default: 1)"
    )
    group.add_argument(
        "--sim-param", action="append", default=[], metavar="NAME=VALUE",
        help=f"set one simulator parameter, repeatable: {PARAMETERS_HELP}",
    )


def options_from(args: argparse.Namespace, env: Mapping[str, str]) -> BuildOptions:
    return BuildOptions(
        engines_dir=args.engines_dir,
        checkpoint=args.checkpoint,
        name=args.name,
        force=args.force,
        quant=args.quant,
        tp=args.tp,
        arch=args.arch,
        trtllm_examples=args.trtllm_examples,
        # A local folder is made absolute: the tools run in the build's scratch folder.
        calib_dataset=str(Path(args.calib_dataset).absolute()) if args.calib_dataset and Path(args.calib_dataset).exists()
        else args.calib_dataset,
        hf_hub_cache=hf_hub_cache(env, Path.home()),
        build_id=str(os.getpid()),
        sim_gpu=args.sim_gpu,
        sim_speedup=args.sim_speedup,
        sim_params=tuple(args.sim_param),
    )


def hub_from(args: argparse.Namespace, env: Mapping[str, str]) -> Hub:
    """The hub settings, as huggingface_hub itself reads them, and --offline."""
    offline = args.offline or env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    return Hub(endpoint=endpoint, token=env.get("HF_TOKEN") or None, offline=offline)


def make_plan(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Mapping[str, str]) -> Plan:
    backend = spec.recipe.target.backend
    cache = options.hf_hub_cache if checkpoint.fetch else None
    machine = probe(backend, options.engines_dir, env.get("CUDA_VISIBLE_DEVICES"), cache)
    return PLANNERS[backend](spec, options, checkpoint, machine)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM cleans up like Ctrl-C: the temporary folders go, the engine folder stays as it was. Either signal
    is also remembered (runner.INTERRUPTED), so one that a library swallows while a step runs (a bare `except`
    in an import) still stops the build when that step returns."""

    def interrupt(signum, frame):
        INTERRUPTED.set()
        raise KeyboardInterrupt

    INTERRUPTED.clear()
    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _refusal(plan: Plan, problems: tuple[str, ...]) -> str:
    items = "\n".join("  - " + problem.replace("\n", "\n    ") for problem in problems)
    return f"cannot build {plan.name} here; nothing was written:\n{items}"


def build_command(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    args = _parser(env).parse_args(argv)
    try:
        recipe = find_recipe(load_catalogue(_recipe_dirs(args, env)), args.model)
        options = options_from(args, env)
        spec = resolve_spec(recipe, options)
        checkpoint = resolve_or_fetch(recipe, options.checkpoint, options.hf_hub_cache, hub_from(args, env))
        plan = make_plan(spec, options, checkpoint, env)
        problems = preflight(plan)
        if args.dry_run:
            print(plan.render(problems))
            return 0
        if checkpoint.fetch:  # before the build proper: its progress on the terminal, then a plan of what it got
            if problems:
                raise PreflightError(_refusal(plan, problems))
            plan, problems = _fetched(plan, env)
        if not args.force and is_up_to_date(plan):
            print(f"{plan.output} is up to date (fingerprint {plan.fingerprint[:19]}…); --force rebuilds it")
            return 0
        if problems:
            raise PreflightError(_refusal(plan, problems))
    except (RecipeError, PreflightError) as exc:
        print(f"inferno build: {exc}", file=sys.stderr)
        return 2
    except FetchError as exc:
        print(f"inferno build: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # during the fetch: what it got stays in the cache, the file it was on included
        print("inferno build: interrupted while fetching the checkpoint; no engine was written. What was fetched "
              "stays in the cache: run the build again to resume", file=sys.stderr)
        return 130
    return _run(plan)


def _fetched(plan: Plan, env: Mapping[str, str]) -> tuple[Plan, tuple[str, ...]]:
    """Run the plan's fetch step, then plan again from the checkpoint it fetched (which the fingerprint covers)."""
    files = plan.checkpoint.fetch
    print(f"[fetch] {files.describe()}", flush=True)
    fetch(files, plan.options.hf_hub_cache)
    plan = make_plan(plan.spec, plan.options, after_fetch(plan.recipe, plan.checkpoint), env)
    return plan, preflight(plan)


def _run(plan: Plan) -> int:
    try:
        with _terminate_as_interrupt():
            run_plan(plan)
        return 0
    except KeyboardInterrupt:
        print("inferno build: interrupted; the temporary folders were removed, no engine was written", file=sys.stderr)
        return 130
    except Exception as exc:  # the step's full output is in the kept log the runner named
        print(f"inferno build: the build failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def catalogue_command(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="inferno models catalogue", description="What can be built.")
    parser.add_argument("--recipes-dir", type=Path, help="extra folder of recipe .toml files")
    args = parser.parse_args(argv)
    try:
        catalogue = load_catalogue(_recipe_dirs(args, env))
    except RecipeError as exc:
        print(f"inferno models catalogue: {exc}", file=sys.stderr)
        return 2
    print(render_catalogue(catalogue))
    return 0
