"""Holding back streamed text that could still become a marker (a tag, a tool-call token)."""

from __future__ import annotations


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (not the whole marker)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
