"""Running a plan: stage by stage with elapsed times on the terminal, full tool output in build.log,
into a temporary folder renamed into place only when complete."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from build_scripts.plan import BuildContext, Plan
from orchestrator.engine.manifest import MANIFEST_FILE

LOG_FILE = "build.log"


def cached_fingerprint(output: Path) -> str | None:
    try:
        return json.loads((output / MANIFEST_FILE).read_text())["build"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_up_to_date(plan: Plan) -> bool:
    return cached_fingerprint(plan.output) == plan.fingerprint


@contextlib.contextmanager
def output_into(log_path: Path):
    """Send this process's stdout and stderr (fds 1 and 2, so native and child output too) into the log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log_path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _say(message: str) -> None:
    print(message, flush=True)


def run_plan(plan: Plan) -> Path:
    """Build the engine; returns its folder. Leaves nothing behind if a step fails or is interrupted."""
    started = time.monotonic()
    workdir = plan.output.parent / f".{plan.name}.build-{os.getpid()}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log_path = workdir / LOG_FILE
    ctx = BuildContext(plan=plan, workdir=workdir, started_at=started)
    _say(f"building {plan.name} ({plan.recipe.target.backend}, {plan.recipe.target.dtype}) -> {plan.output}")
    try:
        for index, step in enumerate(plan.steps, 1):
            _say(f"[{index}/{len(plan.steps)}] {step.name}: {step.description} ...")
            step_started = time.monotonic()
            with log_path.open("a") as log:
                log.write(f"\n=== [{index}/{len(plan.steps)}] {step.name}: {step.render()}\n")
            if step.argv is not None:
                _run_command(step.argv, log_path, workdir)
            else:
                with output_into(log_path):
                    step.action(ctx)
            _say(f"      done in {time.monotonic() - step_started:.1f} s")
        _move_into_place(workdir, plan.output)
    except BaseException:
        kept = plan.output.parent / f".{plan.name}.failed.log"
        if log_path.exists():
            shutil.copy2(log_path, kept)
            _say(f"build failed; its log is kept in {kept}")
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    _say(f"built {plan.output} in {time.monotonic() - started:.1f} s (full log: {plan.output / LOG_FILE})")
    return plan.output


def _run_command(argv: tuple[str, ...], log_path: Path, cwd: Path) -> None:
    with log_path.open("ab") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    if result.returncode != 0:
        raise StepFailed(f"{argv[0]} exited with code {result.returncode}; see {log_path}")


class StepFailed(Exception):
    pass


def _move_into_place(workdir: Path, output: Path) -> None:
    """Swap the finished folder in; an older engine of the same name is removed only afterwards."""
    old = output.parent / f".{output.name}.old-{os.getpid()}"
    if output.exists():
        output.rename(old)
    workdir.rename(output)
    shutil.rmtree(old, ignore_errors=True)
