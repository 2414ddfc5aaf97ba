"""API keys: who is calling, which models they may use, and their limits.

Keys come from a keys file (`--auth.keys-file`, TOML or JSON) and, for compatibility, from `auth.api_keys`
and `auth.admin_key` (best given as INFERNO_AUTH__* variables, never on a command line):

    [defaults]                       # for every key below that does not say otherwise
    requests_per_minute = 600

    [keys.alice]                     # the key's name: what metrics, /admin/usage and the audit log show
    key = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
    models = ["llama3-8b"]           # default: every model
    tokens_per_minute = 200000
    max_concurrent = 8
    priority = "batch"               # or "interactive"
    weight = 2                       # its share of a model next to other keys (default 1; docs/security.md)
    admin = false                    # may use /admin
    metrics = false                  # may read /metrics (admin keys may too); a scrape key: models = []

A key is stored hashed, `sha256:<64 hex digits>` (the SHA-256 of the key's text; `inferno keys new` makes
one), or as plain text. Presented keys are looked up by their SHA-256 digest, so a stored hash works just
like the key itself.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.config import AuthConfig
from orchestrator.scheduler import Priority

log = logging.getLogger(__name__)

HASH_PREFIX = "sha256:"
KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # names show in logs and metric labels: nothing that could forge a line


class KeysError(ValueError):
    """The keys file or a configured key is unusable; the server does not start."""


@dataclass(frozen=True)
class KeyPolicy:
    """What one key may do. `models` None: every model; a limit None: unlimited."""

    name: str
    models: frozenset[str] | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    priority: Priority | None = None  # the default class of its requests, and the best they may ask for
    admin: bool = False
    weight: float = 1.0  # its share of a model's permits, queue and tokens, relative to the other keys
    metrics: bool = False  # may read /metrics, once keys are configured (an admin key may too)

    @property
    def may_scrape(self) -> bool:
        return self.metrics or self.admin

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent))


# The caller of a server without keys: it is open, to every model, without limits. On loopback (a local
# default) that caller may use the admin API too; a server opened to others (auth.allow_open) never lets it.
ANONYMOUS = KeyPolicy("anonymous", admin=True)
OPEN_ANONYMOUS = KeyPolicy("anonymous")


class _Limits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[str] | None = None
    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    max_concurrent: int | None = Field(None, ge=1)
    priority: Literal["interactive", "batch"] | None = None
    admin: bool = False
    weight: float = Field(1.0, gt=0, le=1000)
    metrics: bool = False


class _Key(_Limits):
    key: str = Field(min_length=1)


class _KeysFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    defaults: _Limits = _Limits()
    keys: dict[str, dict] = Field(default_factory=dict)


def digest_of(key: str) -> bytes:
    """The SHA-256 of a key's text: what presented keys are looked up by."""
    return hashlib.sha256(key.encode()).digest()


def hash_key(key: str) -> str:
    """The stored form of a key: `sha256:<hex>`."""
    return HASH_PREFIX + digest_of(key).hex()


def stored_digest(stored: str, where: str) -> bytes:
    """The digest a stored key stands for: `sha256:<64 hex>` as written, anything else hashed as plain text."""
    if not stored.startswith(HASH_PREFIX):
        return digest_of(stored)
    text = stored[len(HASH_PREFIX):]
    try:
        digest = bytes.fromhex(text)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise KeysError(f"{where}: a hashed key is sha256: and 64 hex digits (got {len(text)} characters after it)")
    return digest


class KeyRing:
    """Every configured key, by digest. Empty: the server is open and every caller is `anonymous` (ANONYMOUS, an
    admin; OPEN_ANONYMOUS, not one, when `auth.allow_open` opened it to others)."""

    def __init__(self, policies: dict[bytes, KeyPolicy], allow_open: bool = False):
        self._by_digest = dict(policies)
        self.allow_open = allow_open  # served open to others on purpose: the anonymous caller is no admin
        self.anonymous = OPEN_ANONYMOUS if allow_open else ANONYMOUS

    @property
    def configured(self) -> bool:
        return bool(self._by_digest)

    @property
    def policies(self) -> list[KeyPolicy]:
        return list(self._by_digest.values())

    def find(self, presented: str) -> KeyPolicy | None:
        """The policy of a presented key; None if it is no key of this server."""
        return self._by_digest.get(digest_of(presented))


def load_keys(auth: AuthConfig, models: list[str]) -> KeyRing:
    """The keys of the keys file, then `api_keys` (named api-key-1, ...) and the admin key (named admin).
    Raises KeysError for an unreadable file, a bad entry, a key given twice or two keys of one name; warns of
    plain-text keys in the file and of models that no engine serves."""
    entries: list[tuple[str, bytes, KeyPolicy]] = []
    if auth.keys_file is not None:
        entries += _file_entries(auth.keys_file, set(models))
    for index, key in enumerate(auth.api_keys, start=1):
        name = f"api-key-{index}"
        entries.append((name, stored_digest(key, f"auth.api_keys[{index - 1}]"), KeyPolicy(name)))
    if auth.admin_key:
        entries.append(("admin", stored_digest(auth.admin_key, "auth.admin_key"), KeyPolicy("admin", admin=True)))
    policies: dict[bytes, KeyPolicy] = {}
    for name, digest, policy in entries:
        if any(known.name == name for known in policies.values()):
            raise KeysError(f"two keys are named '{name}': a name is a key's identity (its limits and usage), "
                            "so names must be distinct (auth.api_keys are named api-key-1, ...; auth.admin_key admin)")
        if digest in policies:
            raise KeysError(f"the keys '{policies[digest].name}' and '{name}' are the same key")
        policies[digest] = policy
    return KeyRing(policies, auth.allow_open)


def refuse_open_exposure(host: str, keys: KeyRing) -> None:
    """KeysError when a server without keys would listen beyond loopback and `auth.allow_open` does not say so:
    anyone who reached the port could use every model."""
    if keys.configured or keys.allow_open or _loopback(host):
        return
    raise KeysError(
        f"no API keys are configured and the server would listen on {host!r}, beyond loopback, where anyone who "
        "reaches the port could use every model. Configure keys (--auth.keys-file; inferno keys new makes one), "
        "listen on 127.0.0.1, or pass --auth.allow-open to serve open on purpose"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or "" (every interface)
        return False


def _read(path: Path) -> dict:
    try:
        text = path.read_text()
        return json.loads(text, object_pairs_hook=_distinct) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:  # json and toml decode errors are ValueErrors
        raise KeysError(f"{path}: {exc}") from exc


def _distinct(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose names are distinct (json.loads would keep the last of two silently)."""
    names = [name for name, _ in pairs]
    for name in names:
        if names.count(name) > 1:
            raise KeysError(f"'{name:.80}' appears twice in one object")
    return dict(pairs)


def _file_entries(path: Path, served: set[str]) -> list[tuple[str, bytes, KeyPolicy]]:
    try:
        document = _KeysFile.model_validate(_read(path))
    except ValidationError as exc:
        raise KeysError(f"{path}: {exc}") from exc
    entries = []
    for name, raw in document.keys.items():
        if not KEY_NAME.fullmatch(name):
            raise KeysError(f"{path}: key name {name!r:.80}: use 1 to 64 letters, digits, '.', '_' or '-'")
        merged = {**document.defaults.model_dump(exclude_unset=True), **raw}
        try:
            entry = _Key.model_validate(merged)
        except ValidationError as exc:
            raise KeysError(f"{path}: key '{name}': {exc}") from exc
        if not entry.key.startswith(HASH_PREFIX):
            log.warning("%s: key '%s' is stored as plain text; store its hash instead (inferno keys hash)", path, name)
        unknown = sorted(set(entry.models or ()) - served)
        if unknown:
            log.warning("%s: key '%s' names models this server does not serve: %s", path, name, ", ".join(unknown))
        entries.append((name, stored_digest(entry.key, f"{path}: key '{name}'"), _policy(name, entry)))
    return entries


def _policy(name: str, entry: _Key) -> KeyPolicy:
    limits = entry.model_dump(exclude={"key", "models", "priority"})  # the rest are KeyPolicy's fields as they are
    return KeyPolicy(name, models=None if entry.models is None else frozenset(entry.models),
                     priority=None if entry.priority is None else Priority.parse(entry.priority), **limits)
