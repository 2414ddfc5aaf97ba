"""A build is planned first, then run: the plan is the list of concrete steps, printed by --dry-run.

Each step is either an external command (spelled out in full, e.g. `trtllm-build ...`) or an in-process
action with a one-line description. The plan also carries the inputs fingerprint that the build cache
compares with an existing engine's manifest. Planning reads nothing but what it is given: the recipe,
the user's options, the resolved checkpoint and the probed environment.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from build_scripts.environment import Environment
from build_scripts.fetch import fetch, size_text
from build_scripts.fingerprint import fingerprint
from build_scripts.recipe import Recipe
from build_scripts.requirements import requirements
from build_scripts.sources import Checkpoint
from build_scripts.spec import BuildOptions, BuildSpec
from orchestrator.visible_gpus import Gpu

CONTINUATION = " \\\n           "  # a long command in --dry-run output: one flag per line


@dataclass(frozen=True)
class Folders:
    """Where a build writes: the engine folder, the temporary folder renamed into it when complete, and a scratch
    folder for intermediate files. The last two are hidden, beside the engine, on its filesystem."""

    output: Path
    staging: Path
    scratch: Path


def engine_folders(spec: BuildSpec, options: BuildOptions) -> Folders:
    """Absolute paths (the tools run in the scratch folder); the build id keeps concurrent builds apart."""
    output = options.engines_dir.absolute() / spec.name
    build_id, beside = options.build_id, output.parent
    return Folders(output, beside / f".{output.name}.build-{build_id}", beside / f".{output.name}.scratch-{build_id}")


@dataclass(frozen=True)
class BuildStep:
    name: str
    description: str
    argv: tuple[str, ...] | None = None  # an external command, run with its output in build.log
    action: Callable[[BuildContext], None] | None = None  # an in-process step
    tool: str | None = None  # the TensorRT-LLM tool an external command runs (trtllm-build, quantize.py, ...)

    def render(self, continuation: str = "") -> str:
        """The command; with `continuation`, one flag and its value per line, joined by it."""
        if not self.argv:
            return self.description
        if not continuation:
            return shlex.join(self.argv)
        head, groups, current = [], [], None
        for token in self.argv:
            if token.startswith("--"):
                current = [token]
                groups.append(current)
            elif current is None:
                head.append(token)
            else:
                current.append(token)
        lines = [shlex.join(head)] + [shlex.join(group) for group in groups]
        return continuation.join(lines)


@dataclass(frozen=True)
class Plan:
    spec: BuildSpec
    options: BuildOptions
    checkpoint: Checkpoint
    output: Path  # the engine folder, renamed into place when complete
    staging: Path  # the temporary folder that becomes the engine folder
    scratch: Path | None  # intermediate files (a converted checkpoint), removed at the end either way
    inputs: dict  # everything the fingerprint covers
    gpu: Gpu | None  # the GPU the build runs on (TensorRT engines only)
    steps: tuple[BuildStep, ...]
    environment: Environment  # the machine as probed for this plan; preflight compares the two

    @property
    def recipe(self) -> Recipe:
        return self.spec.recipe

    @property
    def fingerprint(self) -> str | None:
        """The build cache key; None while an input is unknown (the checkpoint is missing)."""
        return fingerprint(self.inputs) if self.checkpoint.identity is not None else None

    @property
    def tools(self) -> dict[str, str]:
        return self.environment.tools

    @property
    def disk_bytes(self) -> int:
        """Estimated peak disk use under the engines folder."""
        return requirements(self.spec).disk_bytes

    @property
    def name(self) -> str:
        return self.output.name

    @property
    def target_arch(self) -> str:
        return self.spec.arch

    def render(self, problems: tuple[str, ...] = ()) -> str:
        limits = self.recipe.limits
        lines = [
            f"plan for {self.name}: {self.recipe.description}",
            f"  recipe:      {self.recipe.name}",
            f"  target:      {self.spec.summary()}",
            f"  checkpoint:  {self.checkpoint.describe()}",
            f"  limits:      max_batch_size {limits.max_batch_size}, max_input_len {limits.max_input_len}, "
            f"max_seq_len {limits.max_seq_len}, max_num_tokens {limits.max_num_tokens}",
            f"  disk:        about {self.disk_bytes / 1e9:.1f} GB free needed under {self.output.parent}",
            *([f"  fetch:       {size_text(self.checkpoint.fetch.total_bytes)} into {self.options.hf_hub_cache}"]
              if self.checkpoint.fetch else []),
            f"  output:      {self.output} (staged in {self.staging})",
            f"  fingerprint: {self.fingerprint or 'unknown until the checkpoint is ' + ('fetched' if self.checkpoint.fetch else 'found')}",
            "  steps:",
        ]
        for index, step in enumerate(self.steps, 1):
            lines.append(f"    {index}. [{step.name}] {step.description}")
            if step.argv:
                lines.append(f"         {step.render(CONTINUATION)}")
        if problems:
            lines.append(f"  preflight: {len(problems)} problem(s) would stop this build:")
            lines += ["    - " + problem.replace("\n", "\n      ") for problem in problems]
        else:
            lines.append("  preflight: ok")
        return "\n".join(lines)


def fetch_step(checkpoint: Checkpoint) -> BuildStep:
    """The step that downloads the checkpoint's files into the Hugging Face cache (build_scripts/fetch.py)."""
    files = checkpoint.fetch
    return BuildStep("fetch", files.describe(), action=lambda ctx: fetch(files, ctx.plan.options.hf_hub_cache))


@dataclass
class BuildContext:
    """What a running step sees: the plan, and the temporary folder that becomes the engine."""

    plan: Plan
    workdir: Path
    started_at: float


def new_plan(spec: BuildSpec, options: BuildOptions, checkpoint: Checkpoint, env: Environment, steps: tuple[BuildStep, ...],
             *, scratch: bool = False, inputs: dict | None = None) -> Plan:
    """A plan of a planner's `steps`, with what every plan has: the folders engine_folders() names (the scratch
    folder only where the steps use it), the GPU the engine is compiled on (the first visible one of the target
    architecture: none for an engine that runs anywhere), and the inputs the fingerprint covers, which are the
    recipe, the checkpoint's content, the tool versions and the target architecture, plus the planner's `inputs`."""
    folders = engine_folders(spec, options)
    return Plan(
        spec=spec,
        options=options,
        checkpoint=checkpoint,
        output=folders.output,
        staging=folders.staging,
        scratch=folders.scratch if scratch else None,
        inputs={"recipe": spec.recipe.model_dump(mode="json"), "source": checkpoint.identity, "tools": env.tools,
                "target_arch": spec.arch, **(inputs or {})},
        gpu=next((gpu for gpu in env.gpus if gpu.arch == spec.arch), None),
        steps=(fetch_step(checkpoint), *steps) if checkpoint.fetch else steps,
        environment=env,
    )
