"""Running a coroutine on the fastest event loop available (uvloop where installed)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


def run(main: Coroutine):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
