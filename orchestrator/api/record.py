"""What the server knows about one HTTP request while it is handled, under one typed request key: its id, the
API key's policy, the model it named, and (for generation requests) its inference request, the key's limiter
and what the limiter took. The outcome middleware (outcome.py) makes it first and settles it last."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from orchestrator.access.keys import KeyPolicy
from orchestrator.access.limits import KeyLimiter
from orchestrator.lifecycle import InferenceRequest


def new_id(prefix: str) -> str:
    """An id of the server's own (a request's, a message's, an output item's): `prefix`, "_", 32 hex digits."""
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass
class RequestRecord:
    id: str = field(default_factory=lambda: new_id("req"))
    arrived: float = field(default_factory=time.monotonic)
    body_bytes: int = 0  # the size of the JSON body read, which decides where its prompt is tokenised
    body_pieces: bool = False  # ...and whether its prompt may go piece by piece (api/body.py: off_loop)
    caller: KeyPolicy | None = None  # set by the auth middleware
    model: str | None = None  # the model the request named, once it was allowed to see it
    generation: bool = False  # a chat or text completion: metered per key
    inference: InferenceRequest | None = None
    limiter: KeyLimiter | None = None  # the key's limiter, once it admitted the request
    choices_taken: int = 1  # running requests the limiter counted for it (its `n`)
    tokens_taken: int = 0  # tokens the limiter reserved on admission (the prompt and every choice's max_tokens)
    prompt_text: object = None  # the prompt (messages or text), kept only for an audit log with text
    completions: dict[str, list[str]] | None = None  # engine request id -> text, likewise
    status: int | None = None  # the final HTTP status, set once by the outcome middleware
    detached: asyncio.Task | None = None  # work that goes on after the answer (a background response): settled after it


RECORD = web.RequestKey("inferno_record", RequestRecord)


def record_of(http: web.Request) -> RequestRecord:
    """The request's record; one is made if no middleware made it (a handler called directly)."""
    record = http.get(RECORD)
    if record is None:
        record = http[RECORD] = RequestRecord()
    return record
