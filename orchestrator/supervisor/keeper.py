"""Kept weights: an unloaded model's weight files held in host RAM, so that its next load reads no disk.

The HTTP process maps each file read-only and shared, asks the kernel to read it in (`posix_fadvise` and
`madvise(MADV_WILLNEED)`), and pins it with `mlock` where the process may (RLIMIT_MEMLOCK, or CAP_IPC_LOCK). Where it
may not, the mapping stays and the file is read through once, so its pages are in the page cache, but the kernel may
drop them under memory pressure (`pinned` is False); keeping never fails for it. A next load of the model reads the same
files (safetensors maps them; llama.cpp and TensorRT-LLM read them), so it finds their pages in memory.

Reading in and pinning run on a thread, a chunk at a time, so the event loop is never held and a drop stops them
within a chunk. Dropping unmaps the files (which unlocks them). Which files a model keeps and whether it may keep them
(the budget, the memory ledger) is placement's; this module only holds them.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 2**20  # read in and pinned this much at a time: a drop waits for one chunk at most

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
for _call in (_libc.munmap, _libc.mlock):
    _call.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass(frozen=True)
class KeptFiles:
    """What the keeper holds for a model: bytes mapped, whether they are pinned, since when (Unix time)."""

    bytes: int
    pinned: bool
    since: float


@dataclass
class _Mapping:
    """One file mapped read-only into this process (by libc: Python's mmap cannot give a read-only mapping's
    address to mlock)."""

    path: Path
    address: int
    size: int

    @classmethod
    def open(cls, path: Path) -> _Mapping:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return cls(path, 0, 0)
            address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, file.fileno(), 0)
            if address in (None, MAP_FAILED):
                error = ctypes.get_errno()
                raise OSError(error, f"cannot map {path}: {os.strerror(error)}")
            os.posix_fadvise(file.fileno(), 0, size, os.POSIX_FADV_WILLNEED)
        _libc.madvise(address, size, mmap.MADV_WILLNEED)
        return cls(path, address, size)

    def pin(self, offset: int, length: int) -> bool:
        """mlock a chunk (reading it in); False where the process may not lock that much."""
        return _libc.mlock(self.address + offset, length) == 0

    def read_in(self, offset: int, length: int) -> None:
        """Bring a chunk into the page cache without pinning it: read it through."""
        with open(self.path, "rb") as file:
            file.seek(offset)
            while length > 0 and (chunk := file.read(min(length, 2**20))):
                length -= len(chunk)

    def close(self) -> None:
        if self.size:
            _libc.munmap(self.address, self.size)
            self.size = 0


@dataclass
class _Holding:
    mappings: list[_Mapping]
    since: float
    pinned: bool = False
    stopping: bool = False
    task: asyncio.Future | None = None
    bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.bytes = sum(m.size for m in self.mappings)

    def bring_in(self) -> None:
        """On a thread: pin every chunk, or (once a lock is refused) read the rest through unpinned."""
        pinning = True
        for mapping in self.mappings:
            for offset in range(0, mapping.size, CHUNK_BYTES):
                if self.stopping:
                    return
                length = min(CHUNK_BYTES, mapping.size - offset)
                if pinning and not mapping.pin(offset, length):
                    pinning = False
                    log.info("mlock refused (%s): kept weights stay mapped, not pinned", os.strerror(ctypes.get_errno()))
                if not pinning:
                    try:
                        mapping.read_in(offset, length)
                    except OSError as exc:  # the mapping still holds what the kernel read in
                        log.warning("reading %s in: %s", mapping.path, exc)
                        return
        self.pinned = pinning and self.bytes > 0

    def close(self) -> None:
        for mapping in self.mappings:
            mapping.close()


OffLoop = Callable[[Callable[[], None]], Awaitable[None]]


class WeightKeeper:
    """Holds models' weight files in host RAM, by model name. `off_loop` runs its blocking work (reading in, pinning,
    unmapping) away from the event loop: on a thread of asyncio's by default."""

    def __init__(self, off_loop: OffLoop = asyncio.to_thread) -> None:
        self._held: dict[str, _Holding] = {}
        self._off_loop = off_loop

    def keep(self, model: str, files: list[Path]) -> int:
        """Map `files` and start bringing them in (on a thread); returns the bytes mapped. OSError when a file
        cannot be opened or mapped: then nothing is kept."""
        mappings: list[_Mapping] = []
        try:
            for path in files:
                mappings.append(_Mapping.open(path))
        except OSError:
            for mapping in mappings:
                mapping.close()
            raise
        holding = _Holding(mappings, time.time())
        self._held[model] = holding
        holding.task = asyncio.ensure_future(self._off_loop(holding.bring_in))
        return holding.bytes

    def kept(self, model: str) -> KeptFiles | None:
        holding = self._held.get(model)
        return None if holding is None else KeptFiles(holding.bytes, holding.pinned, holding.since)

    async def settled(self, model: str) -> None:
        """Wait until the model's files are read in (and pinned where they may be)."""
        holding = self._held.get(model)
        if holding is not None and holding.task is not None:
            await asyncio.shield(holding.task)

    async def drop(self, model: str) -> None:
        """Stop bringing the model's files in and unmap them (on a thread: unlocking many GiB takes a while)."""
        holding = self._held.pop(model, None)
        if holding is None:
            return
        holding.stopping = True
        if holding.task is not None:
            await asyncio.shield(holding.task)
        await self._off_loop(holding.close)

    async def close(self) -> None:
        await asyncio.gather(*(self.drop(model) for model in list(self._held)))
