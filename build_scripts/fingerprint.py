"""The build cache key: a digest of every input that can change an engine.

It covers the recipe, the build options, the checkpoint's content identity, the tool versions and the
target GPU architecture. Content identity is cheap: each file's size plus a hash of its first and last
MiB (and its name, for folders), so a multi-GB checkpoint is fingerprinted in milliseconds while any
re-download, truncation or replacement still changes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

BUILDER_VERSION = "1"  # bump when the build's output for the same inputs changes
_EDGE = 1 << 20


def file_identity(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_EDGE))
        if size > 2 * _EDGE:
            handle.seek(size - _EDGE)
            digest.update(handle.read(_EDGE))
        elif size > _EDGE:
            digest.update(handle.read())
    return digest.hexdigest()


def content_identity(path: Path) -> dict[str, str]:
    """Identity of a file, or of every file under a folder (by relative path)."""
    if path.is_file():
        return {path.name: file_identity(path)}
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return {str(p.relative_to(path)): file_identity(p) for p in files}


def fingerprint(inputs: dict) -> str:
    canonical = json.dumps({"builder": BUILDER_VERSION, **inputs}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
