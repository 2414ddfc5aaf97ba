"""`python -m bench.baselines`: an `inferno bench` run with the baselines Inferno's developers hold the serving
path against, in the same run on the same levels and prompts, with the ratios in the same result file:

- `--in-process` (needs `--engines-dir`): each model's backend driven in this process, with no HTTP, IPC or
  worker, after the server has stopped (inprocess.py);
- `--baseline-sse`: a bare aiohttp SSE server that generates nothing (sse_server.py), after the target; alone
  (no `--url` or `--engines-dir`) it is the target: the floor for the client plus aiohttp.

    python -m bench.baselines --engines-dir engines --model smollm2-135m --concurrency 1,4,16 --in-process
    python -m bench.baselines --baseline-sse --concurrency 64 --osl 256 [--sse-step-ms 5] [--sse-burst 1]

Every other flag is `inferno bench`'s (docs/benchmarking.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from bench.inprocess import in_process_baseline
from bench.sse_server import READY
from orchestrator.bench.cli import run_command
from orchestrator.bench.options import BenchError, BenchOptions, options_from, parser
from orchestrator.bench.run import Baseline, Show, Workload, http_series, open_target
from orchestrator.bench.targets import Target, TargetError
from orchestrator.launch import PROJECT_ROOT

PROG = "python -m bench.baselines"


def start_bare_sse(step_ms: float, burst: int, log_path: Path, timeout_s: float = 30) -> Target:
    """The bare SSE server (sse_server.py) as a child process on a free loopback port."""
    command = [sys.executable, "-m", "bench.sse_server", "--step-ms", str(step_ms), "--burst", str(burst)]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
    pattern = re.compile(re.escape(READY) + r"(http://\S+)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        match = pattern.search(log_path.read_text(errors="replace"))
        if match:
            return Target(
                "bare-sse", match.group(1), ["bare-sse"], process.pid, {"bare-sse": None},
                {"step_ms": step_ms, "burst": burst}, lambda pid: {pid: "bare-sse"}, lambda: _stop(process),
                series="bare-sse",
            )
        time.sleep(0.05)
    _stop(process)
    raise TargetError(f"the bare SSE server did not start:\n{log_path.read_text(errors='replace')}")


def _stop(process: subprocess.Popen, timeout_s: float = 10) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def bare_sse_baseline(step_ms: float, burst: int) -> Baseline:
    """The `bare-sse` series: the same workload against the bare server, started for it and stopped after."""

    async def series(work: Workload, options: BenchOptions, workdir: Path, show: Show) -> list[dict]:
        bare = start_bare_sse(step_ms, burst, workdir / "bare-sse.log")
        try:
            return await http_series("bare-sse", bare, work, options, show)
        finally:
            bare.stop()

    return Baseline("bare-sse", series, {"step_ms": step_ms, "burst": burst})


def main(argv: list[str]) -> int:
    p = parser(PROG)
    group = p.add_argument_group("baselines (after the target, or the bare server alone as the target)")
    group.add_argument("--in-process", action="store_true", help="drive the backend in-process (needs --engines-dir)")
    group.add_argument("--baseline-sse", action="store_true", help="run the bare aiohttp SSE server")
    group.add_argument("--sse-step-ms", type=float, default=0.0, help="bare server: ms between steps (0: flat out)")
    group.add_argument("--sse-burst", type=int, default=1, help="bare server: tokens per stream per step")
    args = p.parse_args(argv)
    try:
        options = options_from(args)
        if args.in_process and not args.engines_dir:
            raise BenchError("--in-process drives the engines itself: give --engines-dir")
        if args.sse_step_ms < 0 or args.sse_burst < 1:
            raise BenchError("--sse-step-ms must be >= 0 and --sse-burst >= 1")
        if not (args.url or args.engines_dir or args.baseline_sse):
            raise BenchError("give a target: --url URL, --engines-dir DIR, or --baseline-sse")
    except BenchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if not (args.url or args.engines_dir):  # the bare server alone is the target
        return run_command(PROG, argv, options,
                           lambda _, workdir: start_bare_sse(args.sse_step_ms, args.sse_burst, workdir / "bare-sse.log"))
    baselines = [in_process_baseline()] if args.in_process else []
    if args.baseline_sse:
        baselines.append(bare_sse_baseline(args.sse_step_ms, args.sse_burst))
    return run_command(PROG, argv, options, open_target, baselines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
