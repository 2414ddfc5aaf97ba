"""Fuzzing the served API: 2,400 request bodies generated from the server's own /openapi.json (fixed seed), half
following the schema with numbers at and past every bound, half with one hostile field, sent 16 at a time to the
real server on the real model (generation kept to a few tokens and choices: what matters is what reaches the
engine). The bodies go to every front door: chat, completions, the Responses API, the Messages API (and its
token count), tokenize. No body may get a 5xx, restart the model's worker, hang, or get an error that is not in
its API's own shape (Anthropic's under /v1/messages, OpenAI's elsewhere), nor a stream that does not end as its
API ends one."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from tests.conftest import DEFAULT_MODEL, admin_models
from tests.fuzz.bodies import BodyGenerator, encode

pytestmark = pytest.mark.e2e

SEED = 20261123
BODIES = 2400
CONCURRENCY = 16
MAX_NEW_TOKENS = 4  # generation kept short: the point is what reaches the engine, not how long it runs
MAX_CHOICES = 4
REQUEST_TIMEOUT_S = 120  # a body that takes longer is a hang
ENDPOINTS = (("/v1/chat/completions", "ChatCompletionRequest", 30), ("/v1/completions", "CompletionRequest", 25),
             ("/v1/responses", "ResponsesRequest", 20), ("/v1/messages", "MessagesRequest", 15),
             ("/v1/messages/count_tokens", "CountTokensRequest", 4), ("/tokenize", "TokenizeText", 3),
             ("/detokenize", "Detokenize", 3))
# the generation limits of each path: capped at MAX_NEW_TOKENS, and set where a missing or null one is no limit
LIMITS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/completions": ("max_tokens",),
          "/v1/responses": ("max_output_tokens",), "/v1/messages": ("max_tokens",)}
# how a stream of named events ends: a Responses stream with its response's last state, a Messages stream with its
# stop or an error event
LAST_EVENTS = {"/v1/responses": {"response.completed", "response.incomplete", "response.failed"},
               "/v1/messages": {"message_stop", "error"}}


def generate(document: dict) -> list[tuple[str, bytes]]:
    generator = BodyGenerator(document, SEED)
    schemas = document["components"]["schemas"]
    paths, names, weights = zip(*ENDPOINTS, strict=True)
    bodies = []
    for _ in range(BODIES):
        path, name = generator.rng.choices(list(zip(paths, names, strict=True)), weights)[0]
        body = generator.body(schemas[name])
        if isinstance(body, dict):
            if generator.rng.random() < 0.9:
                body["model"] = DEFAULT_MODEL
            _bound_generation(body, path)
        bodies.append((path, encode(body)))
    return bodies


def _bound_generation(body: dict, path: str) -> None:
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > MAX_CHOICES:
        body["n"] = MAX_CHOICES
    keys = LIMITS.get(path, ())
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_NEW_TOKENS:
            body[key] = MAX_NEW_TOKENS
    if keys and all(body.get(key) is None for key in keys):
        body[keys[0]] = MAX_NEW_TOKENS  # null is no limit: a generation would run to the end of the context


def is_openai_error(value) -> bool:
    error = value.get("error") if isinstance(value, dict) else None
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error) and bool(error["message"])


def is_anthropic_error(value) -> bool:
    error = value.get("error") if isinstance(value, dict) else None
    return (value.get("type") == "error" and isinstance(error, dict) and isinstance(error.get("type"), str)
            and isinstance(error.get("message"), str) and bool(error["message"]))


def problems_with(path: str, status: int, content_type: str, raw: bytes) -> str | None:
    """What is wrong with one answer to a body sent to `path`, or None."""
    if status == 0:
        return f"no answer within {REQUEST_TIMEOUT_S} s"
    if status >= 500:
        return f"{status}: {raw[:300]!r}"
    if content_type.startswith("text/event-stream"):
        return _stream_problems(path, raw)
    try:
        parsed = json.loads(raw)
    except ValueError:
        return f"{status} with a body that is not JSON: {raw[:300]!r}"
    anthropic = path.startswith("/v1/messages")
    if status != 200 and not (is_anthropic_error if anthropic else is_openai_error)(parsed):
        return f"{status} with an error that is not {'Anthropic' if anthropic else 'OpenAI'}'s shape: {raw[:300]!r}"
    return None


def _stream_problems(path: str, raw: bytes) -> str | None:
    if path not in LAST_EVENTS:  # OpenAI's chunks, ended by [DONE]
        events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
        if not events or events[-1] != b"[DONE]":
            return f"a stream that does not end with [DONE]: {raw[-300:]!r}"
        for event in events[:-1]:
            parsed = json.loads(event)
            if "error" in parsed and not is_openai_error(parsed):
                return f"a malformed error event: {event[:300]!r}"
        return None
    blocks = [block for block in raw.split(b"\n\n") if block.strip()]
    # a comment block (": keepalive", sent while a long prompt is computed) is SSE, not an event
    events = [_named_event(block) for block in blocks if not block.strip().startswith(b":")]
    if not events or None in events:
        return f"a stream that is not named events: {raw[-300:]!r}"
    if any(name != data.get("type") for name, data in events):
        return f"an event whose data names another type: {raw[-300:]!r}"
    name, data = events[-1]
    if name not in LAST_EVENTS[path] or sum(1 for n, _ in events if n in LAST_EVENTS[path]) != 1:
        return f"a stream that does not end once with one of {sorted(LAST_EVENTS[path])}: {raw[-300:]!r}"
    if name == "error" and not is_anthropic_error(data):
        return f"an error event that is not Anthropic's shape: {raw[-300:]!r}"
    failure = data.get("response", {}).get("error") if name == "response.failed" else {"message": "-"}
    if not (isinstance(failure, dict) and failure.get("message")):
        return f"a failed response without its error: {raw[-300:]!r}"
    return None


def _named_event(block: bytes) -> tuple[str, dict] | None:
    lines = block.strip().split(b"\n")
    if len(lines) != 2 or not lines[0].startswith(b"event: ") or not lines[1].startswith(b"data: "):
        return None
    data = json.loads(lines[1][6:])
    return lines[0][7:].decode(), data if isinstance(data, dict) else {}


async def send_all(base_url: str, bodies: list[tuple[str, bytes]]) -> list[tuple[int, str, bytes]]:
    results: list = [None] * len(bodies)
    queue = iter(range(len(bodies)))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def sender() -> None:
            for index in queue:
                path, body = bodies[index]
                try:
                    async with session.post(base_url + path, data=body,
                                            headers={"Content-Type": "application/json"}) as response:
                        results[index] = (response.status, response.headers.get("Content-Type", ""),
                                          await response.read())
                except TimeoutError:
                    results[index] = (0, "", b"")  # no answer within the limit: a hang

        await asyncio.gather(*(sender() for _ in range(CONCURRENCY)))
    return results


def test_no_generated_body_breaks_the_server_or_the_engine(server):
    # the model loaded first (the session's server may have unloaded it: a crash test before this one)
    warm = json.dumps({"model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{server.api}/completions", data=warm, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
    before = admin_models(server.base_url)[DEFAULT_MODEL]
    with urllib.request.urlopen(f"{server.base_url}/openapi.json", timeout=30) as answer:
        document = json.loads(answer.read())
    bodies = generate(document)
    results = asyncio.run(send_all(server.base_url, bodies))
    found = [f"{path} {body[:200]!r} -> {problem}" for (path, body), result in zip(bodies, results, strict=True)
             if (problem := problems_with(path, *result))]
    assert not found, f"{len(found)} of {len(bodies)} bodies were mishandled, first ones:\n" + "\n".join(found[:10])
    after = admin_models(server.base_url)[DEFAULT_MODEL]
    # the same worker, never restarted (the server is the session's: earlier suites may have crashed it on purpose)
    assert (after["pid"], after["crashes"], after["loads"]) == (before["pid"], before["crashes"], before["loads"])
    statuses = sorted({status for status, _, _ in results})
    served = sum(1 for status, _, _ in results if status == 200)
    # Both kinds were exercised: bodies served (about one in ten follows the schema all the way to the engine) and
    # bodies refused.
    assert served > BODIES // 20 and 400 in statuses
