"""Running a plan: stage by stage with elapsed times on the terminal, full tool output in build.log,
into a temporary folder renamed into place only when complete.

Intermediate files (a converted checkpoint) go to a scratch folder that is removed however the build
ends. A build killed outright (SIGKILL, power loss) leaves its hidden folders behind; the next build of
the same engine removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from build_scripts.plan import BuildContext, Plan
from orchestrator.engine.manifest import MANIFEST_FILE

LOG_FILE = "build.log"
LOG_TAIL_LINES = 25
# Set by the CLI's Ctrl-C / SIGTERM handler: checked after each step, in case the step's code swallowed the signal.
INTERRUPTED = threading.Event()


class StepFailed(Exception):
    pass


def cached_fingerprint(output: Path) -> str | None:
    try:
        return json.loads((output / MANIFEST_FILE).read_text())["build"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_up_to_date(plan: Plan) -> bool:
    return plan.fingerprint is not None and cached_fingerprint(plan.output) == plan.fingerprint


@contextlib.contextmanager
def output_into(log_path: Path):
    """Send this process's output into the log: fds 1 and 2 (native code, child processes) and Python's
    sys.stdout and sys.stderr (which a host such as a test runner may have pointed elsewhere)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log_path.open("a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield
        finally:
            log.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _say(message: str) -> None:
    print(message, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60:d}:{minutes % 60:02d}:{secs:02d}"


def _process_gone(build_id: str) -> bool:
    if not build_id.isdigit() or int(build_id) <= 1 or int(build_id) == os.getpid():
        return False
    try:
        os.kill(int(build_id), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_stale(plan: Plan) -> list[Path]:
    """Remove hidden folders left by earlier builds of this engine whose process no longer exists."""
    removed = []
    for kind in ("build", "scratch", "old"):
        for path in plan.output.parent.glob(f".{plan.name}.{kind}-*"):
            if _process_gone(path.name.rsplit("-", 1)[-1]):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def run_plan(plan: Plan) -> Path:
    """Build the engine; returns its folder. Leaves nothing behind if a step fails or is interrupted."""
    started = time.monotonic()
    for path in sweep_stale(plan):
        _say(f"removed {path}, left by an earlier build that did not finish")
    workdir, log_path = plan.staging, plan.staging / LOG_FILE
    ctx = BuildContext(plan=plan, workdir=workdir, started_at=started)
    _say(f"building {plan.name} ({plan.spec.summary()}) -> {plan.output}")
    try:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        if plan.scratch is not None:
            plan.scratch.mkdir(parents=True, exist_ok=True)
        for index, step in enumerate(plan.steps, 1):
            _say(f"[{index}/{len(plan.steps)}] {_clock(time.monotonic() - started)} {step.name}: {step.description}")
            step_started = time.monotonic()
            with log_path.open("a") as log:
                log.write(f"\n=== [{index}/{len(plan.steps)}] {step.name}: {step.render()}\n")
            if step.argv is not None:
                # Tools run in the scratch folder, where stray files they write (timing caches) are removed.
                _run_command(step.argv, step.tool or Path(step.argv[0]).name, log_path, plan.scratch or workdir)
            else:
                with output_into(log_path):
                    step.action(ctx)
            _say(f"      done in {time.monotonic() - step_started:.1f} s")
            if INTERRUPTED.is_set():  # a Ctrl-C or SIGTERM that the step's own code swallowed
                raise KeyboardInterrupt
        _make_readable(workdir)
        _move_into_place(workdir, plan.output)
    except BaseException:
        _report_failure(plan, log_path)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        if plan.scratch is not None:
            shutil.rmtree(plan.scratch, ignore_errors=True)
    (plan.output.parent / f".{plan.name}.failed.log").unlink(missing_ok=True)  # an earlier failure's, now stale
    _say(f"built {plan.output} in {_clock(time.monotonic() - started)} (full log: {plan.output / LOG_FILE})")
    return plan.output


def _report_failure(plan: Plan, log_path: Path) -> None:
    if not log_path.exists():
        return
    kept = plan.output.parent / f".{plan.name}.failed.log"
    shutil.copyfile(log_path, kept)
    tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    print("\n".join(["--- end of the build log ---", *tail, "---"]), file=sys.stderr, flush=True)
    _say(f"build failed; nothing was installed; its full log is kept in {kept}")


def _run_command(argv: tuple[str, ...], tool: str, log_path: Path, cwd: Path) -> None:
    with log_path.open("ab") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    if result.returncode != 0:
        raise StepFailed(f"{tool} exited with code {result.returncode}")


def _make_readable(folder: Path) -> None:
    """Some writers create private files (0600); an engine is read by whoever serves it, so each file gets
    the read permissions the folder itself was created with (what the umask allows)."""
    readable = folder.stat().st_mode & 0o444
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(path.stat().st_mode | readable)


def _move_into_place(workdir: Path, output: Path) -> None:
    """Swap the finished folder in; an older engine of the same name is removed only afterwards.

    Ctrl-C and SIGTERM wait until both renames are done, so the engine folder is always whole.
    """
    old = output.parent / f".{output.name}.old-{os.getpid()}"
    with _signals_deferred():
        if output.exists():
            output.rename(old)
        workdir.rename(output)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _signals_deferred():
    signals = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
