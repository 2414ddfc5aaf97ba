"""The servers of a soak run, over engines made in its own folder.

A server serves sim engines or real ones, never both (docs/simulation.md), so a soak run starts two:

- **sim**: one simulated Llama-3.1-8B engine served under three names. `sim-hot` is pinned (always loaded,
  the bulk of the traffic); `sim-a` and `sim-b` each take more than half of what the memory ledger has left
  beside it (`--memory.capacity-bytes`), so they never fit together and every change between them evicts
  one and loads the other.
- **hf**: the real SmolLM2 engine (hard links to the given folder, or a link to the folder across file
  systems), pinned, on one CPU thread, at low concurrency: the real backend in the mix (the embedded default,
  llamacpp; or the hf engine with `--model smollm2-135m-hf`). A llamacpp engine gets a small RAM prompt cache,
  which fills during the warm-up.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.engine.manifest import load_manifest
from orchestrator.launch import PROJECT_ROOT, ServerProcess, copy_engine, start_server

GiB = 2**30
SIM_HOT = "sim-hot"
SIM_PAIR = ("sim-a", "sim-b")
SIM_RECIPE = "llama3.1-8b-sim"
# Simulated H100 bytes (weights + KV budget + runtime overhead): sim-hot about 13.9 GB, each of the pair about
# 33.2 GB. 60 GB holds sim-hot and one of the pair, never both of the pair.
SIM_KV_BYTES = {SIM_HOT: 2 * GiB, SIM_PAIR[0]: 20 * GiB, SIM_PAIR[1]: 20 * GiB}
SIM_CAPACITY_BYTES = 60_000_000_000
SOAK_PROMPT_CACHE_BYTES = 16 * 2**20  # a dozen saved prompts of SmolLM2


class SoakError(Exception):
    """The run cannot start: what is missing or what failed, said plainly."""


@dataclass(frozen=True)
class SimEngines:
    speedup: float = 1.0  # simulated time runs this many times faster
    load_s: float = 1.0  # simulated load time (a real 8B FP8 load is about 6.5 s)
    tokenizer_from: Path | None = None  # a sim engine or checkpoint to take the tokenizer from


def _build(log: Path, *args: str) -> None:
    command = [sys.executable, "-m", "orchestrator", "build", *args]
    with log.open("a") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, check=False)
    if result.returncode != 0:
        raise SoakError(f"`inferno build {' '.join(args)}` failed:\n{log.read_text()[-2000:]}")


def make_sim_engines(workdir: Path, options: SimEngines) -> Path:
    """The sim server's engines folder: one engine built with `options`, served under three names. Without
    `tokenizer_from`, the recipe's stand-in tokenizer is extracted first (about 20 s)."""
    engines, log = workdir / "sim-engines", workdir / "sim-build.log"
    engines.mkdir(parents=True)
    tokenizer = options.tokenizer_from
    if tokenizer is None:
        _build(log, SIM_RECIPE, "--engines-dir", str(workdir / "sim-tokenizer"), "--name", "tokenizer")
        tokenizer = workdir / "sim-tokenizer" / "tokenizer"
    _build(log, SIM_RECIPE, "--engines-dir", str(engines), "--name", SIM_HOT, "--checkpoint", str(tokenizer),
           "--sim-speedup", f"{options.speedup:g}", "--sim-param", f"load_s={options.load_s:g}")
    for name in SIM_PAIR:
        copy_engine(engines / SIM_HOT, engines, name)
    return engines


def _settings(path: Path, pinned: str, kv_bytes: dict[str, int]) -> Path:
    lines = []
    for name in sorted({pinned, *kv_bytes}):
        lines.append(f"[models.{name}]")
        if name == pinned:
            lines.append("pinned = true")
        if name in kv_bytes:
            lines.append(f"kv_cache_bytes = {kv_bytes[name]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def sim_server_args(workdir: Path) -> list[str]:
    settings = _settings(workdir / "sim-models.toml", SIM_HOT, SIM_KV_BYTES)
    return ["--model-settings", str(settings), "--memory.capacity-bytes", str(SIM_CAPACITY_BYTES),
            "--memory.reserve-bytes", "0", "--scheduling.queue-timeout-s", "120"]


def start_sim(workdir: Path, engines: Path) -> tuple[ServerProcess, list[str]]:
    args = sim_server_args(workdir)
    return start_server(engines, workdir / "sim-server.log", *args), args


def make_hf_engines(workdir: Path, engine: Path) -> Path:
    """The hf server's engines folder: `engine` under its own name, by hard links, or by a link to the folder
    where `workdir` is on another file system (a temporary folder in memory, say) and hard links cannot be."""
    if not (engine / "engine.json").is_file():
        raise SoakError(f"no engine at {engine} (build it with `inferno build {engine.name}`, or pass --no-hf)")
    engines = workdir / "hf-engines"
    engines.mkdir(parents=True)
    if engines.stat().st_dev == engine.stat().st_dev:
        copy_engine(engine, engines, engine.name)
    else:
        (engines / engine.name).symlink_to(engine.resolve(), target_is_directory=True)
    return engines


def start_hf(workdir: Path, engines: Path, model: str) -> tuple[ServerProcess, list[str]]:
    settings = _settings(workdir / "hf-models.toml", model, {})
    args = ["--model-settings", str(settings), "--worker.threads", "1"]
    if load_manifest(engines / model).backend == "llamacpp":
        # Its RAM prompt cache grows to its budget as requests finish (by design, then holds): a small one fills
        # during the warm-up and is evicted from all along, so a growth the verdict sees is not the cache filling.
        args += ["--worker.prompt-cache-bytes", str(SOAK_PROMPT_CACHE_BYTES)]
    return start_server(engines, workdir / "hf-server.log", *args, timeout_s=300), args


_ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def log_problems(server: ServerProcess, most: int = 5) -> dict:
    """Entries of a server's log at ERROR level or with a traceback: how many, and the first few in full
    (an entry is a timestamped line and the lines after it)."""
    entries: list[list[str]] = []
    for line in server.log().splitlines():
        if _ENTRY.match(line) or not entries:
            entries.append([line])
        else:
            entries[-1].append(line)
    problems = ["\n".join(e) for e in entries if " ERROR " in e[0] or any(x.startswith("Traceback") for x in e)]
    return {"count": len(problems), "first": problems[:most]}
