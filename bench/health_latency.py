"""How long /health takes to answer while the server works on the biggest prompts it accepts.

Starts the real server, pings /health every 10 ms from its own connection, and meanwhile sends the requests
of `workloads` one after the other, then floods of four clients sending /tokenize and /detokenize bodies at once
(~3.8 MB ones, and the largest the server accepts). The same run with `--inline` parses and tokenises everything on the
event loop, for comparison. Writes JSON to bench/results/.

    python -m bench.health_latency [--inline]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson

from orchestrator.bench.stats import percentile, rounded
from orchestrator.launch import start_server

MODEL = "smollm2-135m"
PING_EVERY_S = 0.01
MAX_BODY_BYTES = 4 * 2**20
WORD = "The quick brown fox jumps over the lazy dog. "


def text_of(chars: int) -> str:
    return (WORD * (chars // len(WORD) + 1))[:chars]


def workloads(max_input_len: int, most_chars: int) -> dict[str, tuple[str, dict]]:
    """What the HTTP process does for the biggest prompts, without the engine's prefill (which runs in the
    worker process): tokenising a chat that fills the context; a chat and a text prompt just under the
    character bound (tokenised in full, then refused as too long); a chat body near the size limit (refused
    by the character bound, before tokenising)."""
    def chat(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    return {
        "tokenize_chat_filling_the_context": ("/tokenize", {"model": MODEL, "messages": chat(text_of(max_input_len * 4 - 400))}),
        "chat_just_under_the_character_bound": ("/v1/chat/completions", {
            "model": MODEL, "max_tokens": 1, "messages": chat(text_of(most_chars - 500))}),
        "text_just_under_the_character_bound": ("/v1/completions", {
            "model": MODEL, "max_tokens": 1, "prompt": text_of(most_chars - 10)}),
        "chat_body_near_the_size_limit": ("/v1/chat/completions", {
            "model": MODEL, "max_tokens": 1, "messages": chat(text_of(MAX_BODY_BYTES - 4096))}),
    }


async def ping(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> list[float]:
    latencies = []
    while not stop.is_set():
        started = time.perf_counter()
        async with session.get(url) as response:
            await response.read()
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(PING_EVERY_S)
    return latencies


async def measure(base_url: str, path: str, body: dict) -> dict:
    """/health latencies while `body` is posted; the body is serialised first, so that the pinger (on this
    same event loop) is not held up by the client's own work."""
    data = orjson.dumps(body)
    stop = asyncio.Event()
    no_limit = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=no_limit) as pinger, aiohttp.ClientSession(timeout=no_limit) as asker:
        pinging = asyncio.create_task(ping(pinger, f"{base_url}/health", stop))
        started = time.perf_counter()
        async with asker.post(f"{base_url}{path}", data=data, headers={"Content-Type": "application/json"}) as response:
            status, answer = response.status, await response.json()
        took = time.perf_counter() - started
        stop.set()
        latencies = await pinging
    return {
        "status": status,
        "error_code": answer.get("error", {}).get("code") if isinstance(answer, dict) else None,
        "request_s": rounded(took, 3),
        "body_bytes": len(data),
        "health_pings": len(latencies),
        "health_max_ms": rounded(max(latencies) * 1000, 2),
        "health_p99_ms": rounded(percentile(latencies, 99) * 1000, 2),
        "health_p50_ms": rounded(percentile(latencies, 50) * 1000, 2),
    }


FLOOD_CLIENTS, FLOOD_ROUNDS, FLOOD_BYTES = 4, 3, 3_800_000


def flood_bodies(longest: int, most_chars: int) -> dict[str, list[tuple[str, bytes]]]:
    """Two floods: ~3.8 MB /tokenize texts and /detokenize id lists (past what the model holds: refused), and the
    largest the server accepts (a text of the longest prompt's characters, the longest sequence's ids); in each,
    two clients send /tokenize and two /detokenize."""
    def pair(chars: int, ids: int) -> list[tuple[str, bytes]]:
        tokens = (list(range(1, 40_000)) * (ids // 39_999 + 1))[:ids]
        return [("/tokenize", orjson.dumps({"model": MODEL, "prompt": text_of(chars)})),
                ("/detokenize", orjson.dumps({"model": MODEL, "tokens": tokens}))] * (FLOOD_CLIENTS // 2)

    return {"tokenize_flood_3_8_mb": pair(FLOOD_BYTES, FLOOD_BYTES // 6),
            "tokenize_flood_at_the_bounds": pair(most_chars, longest)}


async def measure_flood(base_url: str, bodies: list[tuple[str, bytes]]) -> dict:
    """/health latencies while FLOOD_CLIENTS clients each send FLOOD_ROUNDS big /tokenize or /detokenize
    bodies, one after another."""
    stop = asyncio.Event()
    no_limit = aiohttp.ClientTimeout(total=None)
    statuses: list[int] = []

    async def client(path: str, data: bytes) -> None:
        async with aiohttp.ClientSession(timeout=no_limit) as session:
            for _ in range(FLOOD_ROUNDS):
                async with session.post(f"{base_url}{path}", data=data,
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    statuses.append(response.status)

    async with aiohttp.ClientSession(timeout=no_limit) as pinger:
        pinging = asyncio.create_task(ping(pinger, f"{base_url}/health", stop))
        started = time.perf_counter()
        await asyncio.gather(*(client(path, data) for path, data in bodies))
        took = time.perf_counter() - started
        stop.set()
        latencies = await pinging
    return {"clients": FLOOD_CLIENTS, "requests": len(statuses), "statuses": sorted(set(statuses)),
            "flood_s": rounded(took, 2), "health_pings": len(latencies),
            "health_max_ms": rounded(max(latencies) * 1000, 2),
            "health_p99_ms": rounded(percentile(latencies, 99) * 1000, 2),
            "health_p50_ms": rounded(percentile(latencies, 50) * 1000, 2)}


async def measure_idle(base_url: str, seconds: float = 1.0) -> dict:
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as pinger:
        pinging = asyncio.create_task(ping(pinger, f"{base_url}/health", stop))
        await asyncio.sleep(seconds)
        stop.set()
        latencies = await pinging
    return {"health_pings": len(latencies), "health_max_ms": rounded(max(latencies) * 1000, 2),
            "health_p99_ms": rounded(percentile(latencies, 99) * 1000, 2),
            "health_p50_ms": rounded(percentile(latencies, 50) * 1000, 2)}


async def run(base_url: str, engine_dir: Path) -> dict:
    from orchestrator.api.preparation import most_prompt_chars
    from orchestrator.engine.catalogue import discover

    engine = discover(engine_dir.parent, (engine_dir.name,)).engines[engine_dir.name]
    results = {"idle": await measure_idle(base_url)}
    for name, (path, body) in workloads(engine.manifest.limits.max_input_len, most_prompt_chars(engine)).items():
        results[name] = await measure(base_url, path, body)
        print(name, results[name], file=sys.stderr, flush=True)
    limits = engine.manifest.limits
    for name, bodies in flood_bodies(limits.max_seq_len, most_prompt_chars(engine)).items():
        results[name] = await measure_flood(base_url, bodies)
        print(name, results[name], file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inline", action="store_true", help="parse and tokenise every body on the event loop")
    parser.add_argument("--engines-dir", default="engines")
    args = parser.parse_args()
    engines = Path(args.engines_dir)
    flags = ["--models", MODEL, "--http.max-body-bytes", str(MAX_BODY_BYTES)]
    if args.inline:
        flags += ["--http.inline-body-bytes", str(MAX_BODY_BYTES)]
    with tempfile.TemporaryDirectory() as scratch:
        server = start_server(engines, Path(scratch) / "server.log", *flags, timeout_s=300)
        try:
            results = asyncio.run(run(server.base_url, engines / MODEL))
        finally:
            server.stop()
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "inline": args.inline, "results": results}
    out = Path("bench/results") / f"health_latency-{'inline' if args.inline else 'threaded'}-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
