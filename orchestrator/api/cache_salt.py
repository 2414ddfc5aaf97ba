"""Whose prefix cache a request may use: the salt every engine request carries (EngineRequest.cache_salt).

Prompt tokens computed for one request are reused only by requests with the same salt, so no key can learn from
`cached_tokens` (or from a fast first token) that another key sent a prompt. By default the salt is the caller's
key: requests of one key share their prefixes, requests of different keys never do. A request may name its own
`cache_salt` (vLLM's field) to share on purpose: every request that names the same salt shares, whatever its
key. Anonymous callers without a salt share one cache, "" (the salt of the server's own requests too).

The salt is a digest, so a client's salt can never equal a key's, and neither reveals what it was made from.
"""

from __future__ import annotations

import hashlib

from orchestrator.access.keys import ANONYMOUS, OPEN_ANONYMOUS, KeyPolicy

MAX_CACHE_SALT_CHARS = 256


def cache_salt(caller: KeyPolicy | None, asked: str | None) -> str:
    """The salt of a request from `caller` (None or an anonymous policy: a server without keys) that asked for
    the salt `asked` (None: it did not)."""
    if asked is not None:
        return _digest("salt", asked)
    if caller is None or caller is ANONYMOUS or caller is OPEN_ANONYMOUS:
        return ""
    return _digest("key", caller.name)


def _digest(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}\0{value}".encode()).hexdigest()[:32]
