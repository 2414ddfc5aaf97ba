"""Request bodies: JSON only, bounded in size and in time, and work on big ones kept off the event loop.

The event loop serves every request; nothing one request does may hold it for long. Parsing is fast
(pydantic-core: ~3 ms per MB, and it holds the GIL on any thread, so it stays inline), but a chat template
and the tokenizer take time in proportion to the prompt (Llama 3.1's tokenizer: ~0.2 µs per character). So
bodies larger than `http.inline_body_bytes` have their prompt rendered and tokenised on a thread (`off_loop`,
once per request), where the tokenizer releases the GIL (text/prompt.py), while smaller ones are done inline.
A thread hop costs ~20 µs of CPU of its own (a wake-up, a future chained back to the loop), but tokenising
inline holds every stream: 128 new requests of 128-token prompts arriving together (a closed loop's wave) held
the loop ~20 ms at 2 KiB inline, and ITL p99 rose from 27 to 36 ms, so the default stays at 512 bytes.
Except a body whose prompt the model's tokenizer takes piece by piece (all ASCII, no escape, up to
`pieces.MAX_CHARS` bytes): that is Python holding the GIL (text/pieces.py, ~1 µs per token), which a thread
would not make parallel, so it stays inline (the hop and the threads' wake-ups cost a 128-token prompt's
request ~140 µs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from orchestrator.api.http import validate
from orchestrator.api.record import record_of
from orchestrator.api.state import STATE
from orchestrator.errors import PayloadTooLarge, RequestTimeout, UnsupportedMediaType
from orchestrator.text.pieces import MAX_CHARS
from orchestrator.text.prompt import PromptEncoder

JSON = "application/json"
T = TypeVar("T")


async def read_json(http: web.Request, most_bytes: int | None = None) -> bytes:
    """The body of a JSON request. Raises UnsupportedMediaType (415) unless its Content-Type is
    application/json, PayloadTooLarge (413) past `http.max_body_bytes` (or the route's own `most_bytes`, when
    lower), RequestTimeout (408) when it does not arrive within `http.body_timeout_s`."""
    limits = http.app[STATE].config.http
    if most_bytes is not None and most_bytes < limits.max_body_bytes:
        limits = limits.model_copy(update={"max_body_bytes": most_bytes})
    if http.content_type != JSON:
        given = http.headers.get("Content-Type")
        raise UnsupportedMediaType(
            f"the request body must be JSON, sent with Content-Type: {JSON} "
            f"(got {'no Content-Type' if given is None else repr(given[:80])})"
        )
    if http.content_length is not None and http.content_length > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"the request body has {http.content_length} bytes; this server accepts at most {limits.max_body_bytes}"
        )
    timeout_s = None if http.content.is_eof() else limits.body_timeout_s  # no timer for a body already here
    try:
        async with asyncio.timeout(timeout_s):
            body = await http.read()  # aiohttp refuses a chunked body past client_max_size (413)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {limits.body_timeout_s:g} s") from None
    if len(body) > limits.max_body_bytes:  # a chunked body, which came without a Content-Length
        raise PayloadTooLarge(f"the request body has {len(body)} bytes; this route accepts at most "
                              f"{limits.max_body_bytes}")
    record = record_of(http)
    record.body_bytes = len(body)
    record.body_pieces = len(body) <= MAX_CHARS and body.isascii() and b"\\u" not in body
    return body


async def parse(http: web.Request, wire_type: type[BaseModel]) -> BaseModel:
    """The JSON body as `wire_type` (InvalidRequest naming the field that is wrong)."""
    return validate(await read_json(http), wire_type)


async def off_loop(http: web.Request, work: Callable[..., T], *args,
                   prompts: PromptEncoder | None = None) -> T:
    """`work(*args)` inline for a small body, or one whose prompt `prompts` (the tokenizer `work` uses for it)
    takes piece by piece; on a thread for one larger than `http.inline_body_bytes`."""
    record = record_of(http)
    pieces = record.body_pieces and prompts is not None and prompts.by_pieces
    if record.body_bytes > http.app[STATE].config.http.inline_body_bytes and not pieces:
        return await asyncio.to_thread(work, *args)
    return work(*args)
