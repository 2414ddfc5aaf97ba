"""Probes of grammar cost against the real server: does an expensive guide slow other tenants, and does a
fresh grammar get its verdict while slow ones are being checked?

Starts `inferno serve` on the embedded default (two API keys: a victim and an attacker), then:

- H2: one streamed completion's inter-token latency alone, and while two attacker clients each send one
  `n: 16` request constrained by the regex `([a-z ]{64}\\n){8}` (their statuses are reported: 400 means the
  attack was refused at the grammar check);
- M1: how long a fresh small grammar takes (check and one token) alone, while the attacker's two slow
  grammars are being checked, and (for comparison) when the attacker itself sends it.

    python -m bench.grammar_attack [--engines-dir engines] [--model smollm2-135m]

Writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from orchestrator.launch import start_server

KEYS = {"victim": "probe-victim-key", "attacker": "probe-attacker-key"}
ATTACK_REGEX = "([a-z ]{64}\n){8}"


def slow_grammar(rules: int, salt: str) -> str:
    """Many rules, each a star over a wide character class: seconds to compile (a new one each time)."""
    body = "\n".join(f'r{i} ::= [^"{chr(97 + i % 26)}]* "{chr(97 + (i * 7) % 26)}"' for i in range(rules))
    return f'root ::= "{salt}" ' + " ".join(f"r{i}" for i in range(rules)) + "\n" + body


async def post(session: aiohttp.ClientSession, url: str, key: str, body: dict) -> tuple[int, float]:
    started = time.perf_counter()
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {KEYS[key]}"}) as response:
        await response.read()
        return response.status, time.perf_counter() - started


async def stream_gaps(session: aiohttp.ClientSession, base: str, model: str) -> list[float]:
    """Seconds between the victim's streamed tokens (a 32-token completion)."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 32, "stream": True, "temperature": 0}
    arrivals = []
    headers = {"Authorization": f"Bearer {KEYS['victim']}"}
    async with session.post(f"{base}/v1/completions", json=body, headers=headers) as response:
        async for line in response.content:
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(arrivals[1:])]  # from the second token on


async def probe_h2(session: aiohttp.ClientSession, base: str, model: str) -> dict:
    alone = await stream_gaps(session, base, model)
    attack_body = {"model": model, "prompt": "Words:", "max_tokens": 128, "n": 16,
                   "structured_outputs": {"regex": ATTACK_REGEX}}
    attacks = [asyncio.ensure_future(post(session, f"{base}/v1/completions", "attacker", attack_body))
               for _ in range(2)]
    await asyncio.sleep(0.5)
    under = await stream_gaps(session, base, model)
    statuses = [task.result()[0] if task.done() else "still running" for task in attacks]
    for task in attacks:  # a served attack may run for minutes; leaving cancels it on the server
        task.cancel()
    await asyncio.gather(*attacks, return_exceptions=True)
    alone_ms, under_ms = statistics.median(alone) * 1000, statistics.median(under) * 1000
    return {"itl_ms_alone": round(alone_ms, 2), "itl_ms_under_attack": round(under_ms, 2),
            "ratio": round(under_ms / alone_ms, 2), "attack_statuses": statuses}


async def fresh_check(session: aiohttp.ClientSession, base: str, model: str, key: str) -> tuple[int, float]:
    body = {"model": model, "prompt": "Code:", "max_tokens": 1,
            "structured_outputs": {"regex": f"{uuid.uuid4().hex[:8]}[a-z]{{3}}"}}
    return await post(session, f"{base}/v1/completions", key, body)


async def probe_m1(session: aiohttp.ClientSession, base: str, model: str) -> dict:
    alone = await fresh_check(session, base, model, "victim")
    results = {"fresh_alone_s": round(alone[1], 3)}
    for asker in ("victim", "attacker"):
        slow = [asyncio.ensure_future(post(session, f"{base}/v1/completions", "attacker", {
            "model": model, "prompt": "x", "max_tokens": 1,
            "structured_outputs": {"grammar": slow_grammar(300 + i, uuid.uuid4().hex[:8])}})) for i in range(2)]
        await asyncio.sleep(0.5)
        status, seconds = await fresh_check(session, base, model, asker)
        slow_statuses = [s for s, _ in await asyncio.gather(*slow)]
        results[f"fresh_by_{asker}_during_slow_s"] = round(seconds, 3)
        results[f"fresh_by_{asker}_status"] = status
        results[f"slow_statuses_{asker}_round"] = slow_statuses
    return results


async def run(base: str, model: str) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        await asyncio.gather(*(fresh_check(session, base, model, key) for key in KEYS))  # checkers started
        await stream_gaps(session, base, model)  # warm
        return {"h2": await probe_h2(session, base, model), "m1": await probe_m1(session, base, model)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    env = {"INFERNO_AUTH__API_KEYS": json.dumps(list(KEYS.values()))}
    with tempfile.TemporaryDirectory() as scratch:
        server = start_server(args.engines_dir, Path(scratch) / "server.log", env=env, timeout_s=300)
        try:
            results = asyncio.run(run(server.base_url, args.model))
        finally:
            server.stop()
    results["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grammar_attack.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
