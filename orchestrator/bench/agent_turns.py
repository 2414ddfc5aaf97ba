"""`inferno bench --scenario agent-turns`: agents' multi-turn conversations on several models sharing one GPU, with and
without a host KV tier.

Every agent has its own system prompt and sends its whole conversation again each turn (the history grows by
its answer and a new user message), as coding and tool-using agents do, then waits `--think-s` (its tools run)
before the next turn; agents start staggered over that time, so between two turns of one agent the others'
turns pass through its model's KV cache. Copies of one engine are served as separate models by one server, so
they share its device:
with sim engines, one simulated GPU. The run is repeated under each variant of the models' settings
(`VARIANTS`: with and without a host tier, each with and without the system prompt kept at high retention
priority), a fresh server each time, and prints, per variant and turn, the prompt tokens, the cached prompt tokens
(`usage.prompt_tokens_details.cached_tokens`) and the time to first token, as JSON.

    inferno bench --scenario agent-turns --engines-dir engines --model llama3.1-8b-instruct-sim
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from orchestrator.launch import copy_engine, start_server

GiB = 2**30
# Each variant's per-model settings, over --kv-cache-bytes (the host tier's size is --host-cache-bytes).
VARIANTS = {"device only": {"prompt_cache_bytes": 0, "retain_system_prompt": False},
            "device only, system prompt kept": {"prompt_cache_bytes": 0, "retain_system_prompt": True},
            "host tier": {"prompt_cache_bytes": None, "retain_system_prompt": False},
            "host tier, system prompt kept": {"prompt_cache_bytes": None, "retain_system_prompt": True}}
WORDS = ("file", "test", "error", "patch", "module", "function", "result", "change", "line", "build", "check",
         "value", "return", "import", "class", "update", "search", "tool", "call", "output")


@dataclass(frozen=True)
class Scenario:
    engines_dir: Path
    engine: str
    models: int
    agents: int
    turns: int
    system_words: int
    user_words: int
    answer_tokens: int
    think_s: float
    kv_cache_bytes: int
    host_cache_bytes: int
    seed: int
    out: Path | None


def parse(argv: list[str]) -> Scenario:
    p = argparse.ArgumentParser(prog="inferno bench --scenario agent-turns", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=("agent-turns",), default="agent-turns", help="this scenario")
    p.add_argument("--engines-dir", type=Path, required=True)
    p.add_argument("--model", required=True, help="the engine every model copies (a sim engine: one simulated GPU)")
    p.add_argument("--models", type=int, default=3, help="models sharing the device")
    p.add_argument("--agents", type=int, default=6, help="conversations per model")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--system-words", type=int, default=6000, help="each agent's system prompt, in words")
    p.add_argument("--user-words", type=int, default=300, help="each user message, in words")
    p.add_argument("--answer-tokens", type=int, default=50, help="each answer, in tokens (end tokens ignored)")
    p.add_argument("--think-s", type=float, default=2.0, help="an agent's pause between an answer and its next turn")
    p.add_argument("--kv-cache-bytes", type=float, default=1.0, help="each model's KV cache on the device, GiB")
    p.add_argument("--host-cache-bytes", type=float, default=3.0, help="each model's host KV tier, GiB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    a = p.parse_args(argv)
    return Scenario(a.engines_dir, a.model, a.models, a.agents, a.turns, a.system_words, a.user_words,
                    a.answer_tokens, a.think_s, int(a.kv_cache_bytes * GiB), int(a.host_cache_bytes * GiB), a.seed,
                    a.out)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversations(scenario: Scenario, model: str) -> list[list[dict]]:
    """Each agent's opening: its own system prompt and its first user message (the same in every variant)."""
    rng = random.Random(f"{scenario.seed}:{model}")
    return [[{"role": "system", "content": f"Agent {model}/{i}. " + _text(rng, scenario.system_words)},
             {"role": "user", "content": _text(rng, scenario.user_words)}] for i in range(scenario.agents)]


async def one_turn(session: aiohttp.ClientSession, api: str, model: str, messages: list[dict],
                   answer_tokens: int) -> dict:
    """Send the conversation, stream the answer: its text, time to first token, prompt and cached tokens."""
    body = {"model": model, "messages": messages, "max_tokens": answer_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    started, first, text, usage = time.perf_counter(), None, [], {}
    async with session.post(f"{api}/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{model}: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", ()):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
            usage = chunk.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"text": "".join(text), "ttft_s": (first or time.perf_counter()) - started,
            "prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": cached}


async def agent(session: aiohttp.ClientSession, api: str, model: str, talk: list[dict], scenario: Scenario,
                start_s: float, rng: random.Random) -> list[dict]:
    """One agent's conversation, turn after turn, from `start_s` on; each turn's result."""
    await asyncio.sleep(start_s)
    results = []
    for turn in range(scenario.turns):
        if turn:
            await asyncio.sleep(scenario.think_s)
        result = await one_turn(session, api, model, talk, scenario.answer_tokens)
        talk += [{"role": "assistant", "content": result["text"]},
                 {"role": "user", "content": _text(rng, scenario.user_words)}]
        results.append(result)
    return results


async def run_variant(scenario: Scenario, api: str, models: list[str]) -> list[dict]:
    """Every agent of every model, started staggered over one think time; a row per turn."""
    talks = [(m, talk) for m in models for talk in conversations(scenario, m)]
    gap = scenario.think_s / len(talks)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        runs = await asyncio.gather(*(
            agent(session, api, m, talk, scenario, i * gap, random.Random(f"{scenario.seed}:{m}:{i}"))
            for i, (m, talk) in enumerate(talks)))
    return [_turn_row(turn + 1, [results[turn] for results in runs]) for turn in range(scenario.turns)]


def _turn_row(turn: int, results: list[dict]) -> dict:
    ttft = sorted(r["ttft_s"] * 1000 for r in results)
    prompt, cached = sum(r["prompt_tokens"] for r in results), sum(r["cached_tokens"] for r in results)
    return {"turn": turn, "requests": len(results), "prompt_tokens_mean": round(prompt / len(results)),
            "cached_tokens_mean": round(cached / len(results)), "cached_share": round(cached / prompt, 3),
            "ttft_ms_p50": round(statistics.median(ttft), 1), "ttft_ms_max": round(ttft[-1], 1)}


def _settings_file(folder: Path, scenario: Scenario, variant: dict) -> Path:
    host = scenario.host_cache_bytes if variant["prompt_cache_bytes"] is None else variant["prompt_cache_bytes"]
    path = folder / "models.toml"
    path.write_text(f"[defaults]\nkv_cache_bytes = {scenario.kv_cache_bytes}\nprompt_cache_bytes = {host}\n"
                    f"retain_system_prompt = {str(variant['retain_system_prompt']).lower()}\n")
    return path


def run(scenario: Scenario) -> dict:
    described = {k: str(v) if isinstance(v, Path) else v for k, v in vars(scenario).items()}
    report = {"scenario": described, "variants": []}
    with tempfile.TemporaryDirectory(prefix="inferno-agent-turns-") as work:
        engines = Path(work) / "engines"
        engines.mkdir()
        models = [f"agent-model-{chr(ord('a') + i)}" for i in range(scenario.models)]
        for name in models:
            copy_engine(scenario.engines_dir / scenario.engine, engines, name)
        for name, variant in VARIANTS.items():
            settings = _settings_file(Path(work), scenario, variant)
            server = start_server(engines, Path(work) / f"{name.replace(' ', '-')}.log", "--models", ",".join(models),
                                  "--model-settings", str(settings), timeout_s=300)
            try:
                rows = asyncio.run(run_variant(scenario, server.api, models))
            finally:
                server.stop()
            report["variants"].append({"name": name, "settings": settings.read_text(), "turns": rows})
    return report


def agent_turns_command(argv: list[str]) -> int:
    report = run(parse(argv))
    text = json.dumps(report, indent=2)
    print(text)
    if report["scenario"]["out"]:
        Path(report["scenario"]["out"]).write_text(text)
    return 0
