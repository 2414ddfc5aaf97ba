"""`inferno bench`'s options: parsed once, checked, frozen. A setting that cannot be honoured is refused
here with a message naming the flag and the value."""

from __future__ import annotations

import argparse
import itertools
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.bench.floor import SOCKETS
from orchestrator.bench.stats import Slo
from orchestrator.bench.workload import LengthDist, ModelMix

SCENARIOS = ("levels", "two-keys", "agent-turns")


class BenchError(Exception):
    """A run that cannot go ahead as asked; the message says why and what to change."""


@dataclass(frozen=True)
class BenchOptions:
    url: str | None
    engines_dir: Path | None
    models: ModelMix | None  # None: the first model the server lists
    server_args: tuple[str, ...]
    server_pid: int | None
    api_key: str | None
    tokenizer: Path | None
    engine_threads: int | None
    concurrency: tuple[int, ...]
    rates: tuple[float, ...]
    requests: int | None
    duration_s: float | None
    max_requests: int
    warmup: int
    trace: Path | None
    seed: int
    timeout_s: float
    isl: LengthDist
    osl: LengthDist
    ignore_eos: bool
    chat: bool
    temperature: float
    slo: Slo
    exclude_threads: tuple[str, ...]
    floor_rounds: int  # 0: no floor measurement
    out: Path
    plot: bool
    scenario: str = "levels"  # or "two-keys" (two_keys.py); agent-turns has its own options (agent_turns.py)
    victim_key: str | None = None  # two-keys with --url: the victim's key (the flood's is api_key)
    victim_osl: int = 16

    def as_dict(self) -> dict:
        """Every setting, for the result file."""
        settings = asdict(self)
        settings |= {"models": self.models.describe() if self.models else "first listed by the server",
                     "isl": self.isl.describe(), "osl": self.osl.describe(), "slo": self.slo.as_dict(),
                     "endpoint": "chat" if self.chat else "completions",
                     "api_key": "(set)" if self.api_key else None,
                     "victim_key": "(set)" if self.victim_key else None}
        return {key: str(value) if isinstance(value, Path) else value for key, value in settings.items()}

    def floor_sockets(self) -> int:
        """The floor's burst: the streams one engine step writes to at the highest closed-loop level (the busiest
        model's share of them); SOCKETS for a rate or a trace, whose streams in flight vary."""
        weights = (self.models.weights or (1.0,) * len(self.models.names)) if self.models else (1.0,)
        return max(1, round(max(self.concurrency) * max(weights) / sum(weights))) if self.concurrency else SOCKETS


def _numbers(text: str | None, kind: type, flag: str) -> tuple:
    if not text:
        return ()
    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise BenchError(f"{flag}: expected comma-separated numbers (got {text!r})") from exc
    if any(v <= 0 for v in values):
        raise BenchError(f"{flag}: every value must be positive (got {text!r})")
    return values


def scenario_of(argv: list[str]) -> str:
    """The `--scenario` named in `argv` (levels when none), read before the scenario's own options are."""
    named = [arg.partition("=")[2] for arg in argv if arg.startswith("--scenario=")]
    named += [after for arg, after in itertools.pairwise(argv) if arg == "--scenario"]
    scenario = named[-1] if named else "levels"
    if scenario not in SCENARIOS:
        raise BenchError(f"--scenario must be one of {', '.join(SCENARIOS)} (got {scenario!r})")
    return scenario


def parser(prog: str = "inferno bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Benchmark an OpenAI-compatible server (docs/benchmarking.md).")
    p.add_argument("--scenario", choices=SCENARIOS, default="levels",
                   help="levels: the load levels below (default); two-keys: one key floods at --concurrency (default "
                        "32) with --osl outputs while another sends --requests one at a time; agent-turns: agents' "
                        "multi-turn conversations with and without a host KV tier, its own options "
                        "(`--scenario agent-turns --help`) (docs/benchmarking.md)")
    target = p.add_argument_group("target (one of --url or --engines-dir)")
    target.add_argument("--url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    target.add_argument("--engines-dir", type=Path, help="start an Inferno server on these engines, stop it after")
    target.add_argument("--model", "--models", dest="models", action="append", default=[], metavar="NAMES",
                        help="model(s): a,b round-robin or a:3,b:1 weighted (default: the first the server lists)")
    target.add_argument("--server-args", default="", help="extra `inferno serve` flags, one string")
    target.add_argument("--server-pid", type=int, help="measure the CPU of this local server process and its children")
    target.add_argument("--api-key", help="sent as a bearer token")
    target.add_argument("--victim-key", help="two-keys with --url: the victim's key (the flood's is --api-key)")
    target.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json, for exact prompt lengths with --url")
    target.add_argument("--engine-threads", type=int,
                        help="CPU threads of the hf engines the bench serves (default: all cores)")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", help="closed-loop levels, e.g. 1,4,16")
    load.add_argument("--rate", help="open-loop levels in requests per second (Poisson arrivals), e.g. 5,10")
    load.add_argument("--requests", type=int, help="requests per level (default 32 unless --duration)")
    load.add_argument("--duration", type=float, help="seconds per level instead of a request count")
    load.add_argument("--max-requests", type=int, default=2000, help="requests prepared per level with --duration")
    load.add_argument("--warmup", type=int, default=2, help="requests per model before measuring (not counted)")
    load.add_argument("--trace", type=Path, help='JSONL replay: {"t": s, "model": name, "isl": n, "osl": n} a line')
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    lengths = p.add_argument_group("lengths")
    lengths.add_argument("--isl", type=int, default=128, help="prompt tokens (the mean with --length-dist lognormal)")
    lengths.add_argument("--osl", type=int, default=128, help="output tokens (the mean with --length-dist lognormal)")
    lengths.add_argument("--victim-osl", type=int, default=16, help="two-keys: the victim's output tokens")
    lengths.add_argument("--length-dist", choices=("fixed", "lognormal"), default="fixed")
    lengths.add_argument("--length-sigma", type=float, default=0.6, help="lognormal sigma; lengths clipped to 1..4x mean")
    lengths.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                         help="do not send ignore_eos: outputs may end before --osl")
    lengths.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    lengths.add_argument("--temperature", type=float, default=0.0)
    measure = p.add_argument_group("measurement")
    measure.add_argument("--slo", default="", help="goodput bounds in seconds, e.g. ttft=0.5,itl=0.05")
    measure.add_argument("--exclude-threads", default="", help="thread names (globs) left out of the server CPU")
    measure.add_argument("--floor-rounds", type=int, default=1000,
                         help="rounds of the kernel's floor measured before the run, 5 ms apart (0: none)")
    output = p.add_argument_group("output")
    output.add_argument("--out", type=Path, default=Path("bench/results"))
    output.add_argument("--no-plot", dest="plot", action="store_false")
    return p


def _check_target(args: argparse.Namespace) -> None:
    if args.url and args.engines_dir:
        raise BenchError("give --url or --engines-dir, not both")
    if args.server_pid is not None and not args.url:
        raise BenchError("--server-pid is for --url targets (a server the bench starts is measured anyway)")
    if args.engine_threads is not None and (args.engine_threads < 1 or not args.engines_dir):
        raise BenchError("--engine-threads needs --engines-dir and a count of at least 1")
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").is_file():
        raise BenchError(f"--tokenizer {args.tokenizer}: no tokenizer.json there")


def _check_load(args: argparse.Namespace, concurrency: tuple, rates: tuple) -> None:
    if args.requests is not None and args.duration is not None:
        raise BenchError("give --requests or --duration, not both")
    if args.trace and (concurrency or rates or args.duration or args.requests):
        raise BenchError("--trace sets the requests and their times: leave out --concurrency, --rate, --requests and --duration")
    for flag, value in (("--requests", args.requests), ("--duration", args.duration), ("--max-requests", args.max_requests)):
        if value is not None and value <= 0:
            raise BenchError(f"{flag} must be positive (got {value})")
    if args.warmup < 0 or args.timeout <= 0 or args.temperature < 0 or args.floor_rounds < 0:
        raise BenchError("--warmup and --floor-rounds must be >= 0, --timeout > 0 and --temperature >= 0")
    requests = args.requests or 32
    if args.scenario == "two-keys":
        if len(concurrency) > 1 or rates or args.trace or args.duration or args.victim_osl < 1:
            raise BenchError("--scenario two-keys takes one --concurrency (the flood's), --requests (the victim's) "
                             "and a positive --victim-osl; no --rate, --trace or --duration")
        return
    if args.duration is None and concurrency and max(concurrency) > requests:
        raise BenchError(f"--requests {requests} is fewer than --concurrency {max(concurrency)}: the level would never reach it")


def parse_options(argv: list[str]) -> BenchOptions:
    """Raises BenchError (or exits through argparse for unknown flags)."""
    return options_from(parser().parse_args(argv))


def options_from(args: argparse.Namespace) -> BenchOptions:
    """The options of parsed arguments (of `parser()`, or of a parser that adds flags of its own to it);
    raises BenchError. Whether a target is given is checked when it is opened (run.open_target)."""
    _check_target(args)
    concurrency = _numbers(args.concurrency, int, "--concurrency")
    rates = _numbers(args.rate, float, "--rate")
    _check_load(args, concurrency, rates)
    try:
        sigma = args.length_sigma if args.length_dist == "lognormal" else 0.0
        isl, osl = LengthDist(args.isl, sigma), LengthDist(args.osl, sigma)
        models = ModelMix.parse(args.models) if args.models else None
        slo = Slo.parse(args.slo)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    return BenchOptions(
        url=args.url, engines_dir=args.engines_dir, models=models, server_args=tuple(shlex.split(args.server_args)),
        server_pid=args.server_pid, api_key=args.api_key, tokenizer=args.tokenizer, engine_threads=args.engine_threads,
        concurrency=concurrency or (() if (rates or args.trace) else (1,)), rates=rates,
        requests=None if args.duration else (args.requests or 32), duration_s=args.duration,
        max_requests=args.max_requests, warmup=args.warmup, trace=args.trace, seed=args.seed, timeout_s=args.timeout,
        isl=isl, osl=osl, ignore_eos=args.ignore_eos, chat=args.endpoint == "chat", temperature=args.temperature,
        slo=slo, exclude_threads=tuple(p.strip() for p in args.exclude_threads.split(",") if p.strip()),
        floor_rounds=args.floor_rounds,
        out=args.out, plot=args.plot, scenario=args.scenario, victim_key=args.victim_key, victim_osl=args.victim_osl,
    )
