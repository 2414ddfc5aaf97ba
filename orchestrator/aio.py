"""Running a coroutine on the fastest event loop available (uvloop where installed), and the garbage collector's
settings for a process that serves: the server's and each worker's."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
from collections.abc import Coroutine

# Allocations between two young-generation collections (CPython's default: 700). A step of 128 streams
# allocates a few thousand short-lived objects (frame rows, chunks), nearly none of them in cycles: at the
# default the collector ran several times per engine step, each pass walking every young container.
GC_YOUNG_THRESHOLD = 50_000


def run(main: Coroutine):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def settle_heap() -> None:
    """Once a serving process has started (imports done; in a worker, before its first load): move everything
    alive now out of the collector's sight for good (gc.freeze: it is never garbage, and older generations no
    longer walk it) and let the young generation grow to GC_YOUNG_THRESHOLD allocations before it is collected."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def reclaim_heap() -> None:
    """After a worker loaded or closed an engine: collect what is garbage now, and hand freed heap pages back to
    the system (glibc keeps them otherwise). An engine's objects are never frozen, so this walks them and not the
    imports settle_heap froze (a full collection of those took 0.2 s of each swap with torch imported)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
