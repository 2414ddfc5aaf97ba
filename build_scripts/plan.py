"""A build is planned first, then run: the plan is the list of concrete steps, printed by --dry-run.

Each step is either an external command (spelled out in full, e.g. `trtllm-build ...`) or an in-process
action with a one-line description. The plan also carries the inputs fingerprint that the build cache
compares with an existing engine's manifest.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from build_scripts.catalog import Recipe


@dataclass(frozen=True)
class BuildOptions:
    engines_dir: Path = Path("engines")
    checkpoint: Path | None = None  # a local checkpoint folder; default: the recipe's source
    name: str | None = None  # engine folder name; default: the recipe name
    force: bool = False


@dataclass(frozen=True)
class Step:
    name: str
    description: str
    argv: tuple[str, ...] | None = None  # an external command, run with its output in build.log
    action: Callable[[BuildContext], None] | None = None  # an in-process step

    def render(self) -> str:
        return shlex.join(self.argv) if self.argv else self.description


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    options: BuildOptions
    source: Path
    output: Path
    inputs: dict  # everything the fingerprint covers, kept for the manifest and for --dry-run
    fingerprint: str
    tools: dict[str, str]
    target_arch: str
    steps: tuple[Step, ...]

    @property
    def name(self) -> str:
        return self.output.name

    def render(self) -> str:
        lines = [f"plan for {self.name}: {self.recipe.description}", f"  output: {self.output}"]
        lines += [f"  fingerprint: {self.fingerprint}"]
        lines += [f"  {i}. [{step.name}] {step.render()}" for i, step in enumerate(self.steps, 1)]
        return "\n".join(lines)


@dataclass
class BuildContext:
    """What a running step sees: the plan, and the temporary folder that becomes the engine."""

    plan: Plan
    workdir: Path
    started_at: float
    facts: dict = field(default_factory=dict)  # steps hand measured facts to the manifest step
