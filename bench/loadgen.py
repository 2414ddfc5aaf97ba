"""An async streaming load generator: a fixed number of chat requests at a fixed concurrency, each timed
from send to first token to last token (aiohttp, SSE parsed by hand to keep the client light)."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.prompts import messages


@dataclass
class Timing:
    sent: float
    first_token: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict) -> Timing:
    timing = Timing(sent=time.perf_counter())
    async with session.post(url, json=body) as response:
        if response.status != 200:
            timing.error = f"HTTP {response.status}: {(await response.text())[:200]}"
            return timing
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                timing.error = chunk["error"]["message"]
                return timing
            if chunk.get("usage"):
                timing.completion_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    now = time.perf_counter()
                    timing.first_token = timing.first_token or now
                    timing.chunk_times.append(now)
    return timing


def request_body(model: str, index: int, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": messages(index),
        "max_tokens": max_tokens,
        "temperature": 0,  # greedy: the direct run generates exactly the same tokens
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def run_load(api: str, model: str, concurrency: int, requests: int, max_tokens: int) -> tuple[list[Timing], float]:
    """Send `requests` requests, `concurrency` at a time; returns their timings and the wall time."""
    indices = iter(range(requests))
    timings: list[Timing] = []
    url = f"{api}/chat/completions"
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client() -> None:
            for index in indices:
                timings.append(await stream_one(session, url, request_body(model, index, max_tokens)))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return timings, time.perf_counter() - started
