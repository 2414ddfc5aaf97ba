"""`python -m bench.baselines`: an `inferno bench` run with the baselines Inferno's developers hold the serving
path against, in the same run on the same levels and prompts, with the ratios in the same result file:

- `--in-process` (needs `--engines-dir`): each model's backend driven in this process, with no HTTP, IPC or
  worker, after the server has stopped (inprocess.py);
- `--baseline-sse`: a bare aiohttp SSE server that generates nothing (sse_server.py), after the target; alone
  (no `--url` or `--engines-dir`) it is the target: the floor for the client plus aiohttp;
- `--baseline-raw`: the same without aiohttp (raw_sse_server.py: an asyncio protocol writing each token straight
  from a step clock's callback): the floor for one write per token from Python. With `--baseline-sse` and no
  other target, the aiohttp server is the target and this one its baseline.

    python -m bench.baselines --engines-dir engines --model smollm2-135m --concurrency 1,4,16 --in-process
    python -m bench.baselines --baseline-sse --concurrency 64 --osl 256 [--sse-step-ms 5] [--sse-burst 1]
    python -m bench.baselines --engines-dir DIR --concurrency 128 --baseline-sse --baseline-raw --sse-step-ms 7

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


# series name -> the module of its server: aiohttp's (sse_server.py) and a raw asyncio protocol's (raw_sse_server.py)
BARE_SERVERS = {"bare-sse": "bench.sse_server", "raw-sse": "bench.raw_sse_server"}


def start_bare_sse(step_ms: float, burst: int, log_path: Path, timeout_s: float = 30, kind: str = "bare-sse") -> Target:
    """A bare SSE server (`kind`, one of BARE_SERVERS) as a child process on a free loopback port."""
    command = [sys.executable, "-m", BARE_SERVERS[kind], "--step-ms", str(step_ms), "--burst", str(burst)]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
    pattern = re.compile(re.escape(READY) + r"(http://\S+)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        match = pattern.search(log_path.read_text(errors="replace"))
        if match:
            return Target(
                kind, match.group(1), ["bare-sse"], process.pid, {"bare-sse": None},
                {"step_ms": step_ms, "burst": burst}, lambda pid: {pid: kind}, lambda: _stop(process), series=kind,
            )
        time.sleep(0.05)
    _stop(process)
    raise TargetError(f"the {kind} server did not start:\n{log_path.read_text(errors='replace')}")


def _stop(process: subprocess.Popen, timeout_s: float = 10) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def bare_sse_baseline(step_ms: float, burst: int, kind: str = "bare-sse") -> Baseline:
    """The `kind` series (bare-sse, raw-sse): the same workload against that bare server, started for it and
    stopped after."""

    async def series(work: Workload, options: BenchOptions, workdir: Path, show: Show) -> list[dict]:
        bare = start_bare_sse(step_ms, burst, workdir / f"{kind}.log", kind=kind)
        try:
            return await http_series(kind, bare, work, options, show)
        finally:
            bare.stop()

    return Baseline(kind, series, {"step_ms": step_ms, "burst": burst})


def main(argv: list[str]) -> int:
    p = parser(PROG)
    group = p.add_argument_group("baselines (after the target, or the bare server alone as the target)")
    group.add_argument("--in-process", action="store_true", help="drive the backend in-process (needs --engines-dir)")
    group.add_argument("--baseline-sse", action="store_true", help="run the bare aiohttp SSE server")
    group.add_argument("--baseline-raw", action="store_true",
                       help="run the raw SSE server (an asyncio protocol, no framework: the floor for Python)")
    group.add_argument("--sse-step-ms", type=float, default=0.0, help="bare servers: ms between steps (0: flat out)")
    group.add_argument("--sse-burst", type=int, default=1, help="bare servers: tokens per stream per step")
    args = p.parse_args(argv)
    try:
        options = options_from(args)
        if args.in_process and not args.engines_dir:
            raise BenchError("--in-process drives the engines itself: give --engines-dir")
        if args.sse_step_ms < 0 or args.sse_burst < 1:
            raise BenchError("--sse-step-ms must be >= 0 and --sse-burst >= 1")
        bare = [kind for kind, wanted in (("bare-sse", args.baseline_sse), ("raw-sse", args.baseline_raw)) if wanted]
        if not (args.url or args.engines_dir or bare):
            raise BenchError("give a target: --url URL, --engines-dir DIR, --baseline-sse or --baseline-raw")
    except BenchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    baselines = [in_process_baseline()] if args.in_process else []
    baselines += [bare_sse_baseline(args.sse_step_ms, args.sse_burst, kind) for kind in bare]
    if not (args.url or args.engines_dir):  # the first bare server is the target, the other its baseline
        first = bare[0]
        return run_command(PROG, argv, options, lambda _, workdir: start_bare_sse(
            args.sse_step_ms, args.sse_burst, workdir / f"{first}.log", kind=first), baselines[1:])
    return run_command(PROG, argv, options, open_target, baselines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
