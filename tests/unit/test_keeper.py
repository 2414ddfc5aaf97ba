"""The weight keeper on real files: kept weights are mapped, resident and locked in RAM; dropping unmaps them; a
process that may not lock memory keeps them mapped and resident, unpinned, and says so."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.supervisor.keeper import WeightKeeper
from tests.conftest import ROOT

SIZE = 6 * 2**20 + 123  # not a whole number of pages
PAGE = os.sysconf("SC_PAGE_SIZE")


def weights_file(folder: Path, name: str = "model.gguf") -> Path:
    path = folder / name
    path.write_bytes(os.urandom(SIZE))
    with open(path, "rb") as file:
        os.fsync(file.fileno())  # clean pages, which the kernel may drop
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path


def mapping(path: Path) -> dict | None:
    """This process's mapping of `path`: its address, length, and the kB smaps says are resident and locked."""
    with open("/proc/self/smaps") as smaps:
        lines = smaps.read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            start, end = (int(part, 16) for part in line.split()[0].split("-"))
            fields = {}
            for row in lines[i + 1:]:
                key, _, value = row.partition(":")
                if " " in key:  # the next mapping's header
                    break
                fields[key] = value.strip()
            return {"address": start, "length": end - start, "locked_kb": int(fields["Locked"].split()[0])}
    return None


def resident_pages(address: int, length: int) -> tuple[int, int]:
    """(pages of the mapping in the page cache, pages of the mapping), by mincore."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    pages = (length + PAGE - 1) // PAGE
    vector = ctypes.create_string_buffer(pages)
    assert libc.mincore(address, length, vector) == 0, os.strerror(ctypes.get_errno())
    return sum(byte & 1 for byte in vector.raw), pages


def test_kept_weights_are_mapped_resident_and_locked_until_dropped(tmp_path):
    path = weights_file(tmp_path)

    async def go():
        keeper = WeightKeeper()
        assert keeper.keep("alpha", [path]) == SIZE
        await keeper.settled("alpha")
        kept, held = keeper.kept("alpha"), mapping(path)
        with open(path, "rb") as file:  # asking the kernel to drop the file's pages: locked ones stay
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        after_pressure = resident_pages(held["address"], held["length"])
        await keeper.drop("alpha")
        return kept, held, after_pressure, keeper.kept("alpha"), mapping(path)

    kept, held, (resident, pages), gone, unmapped = asyncio.run(go())
    assert kept.bytes == SIZE and kept.pinned
    assert held["locked_kb"] * 1024 >= SIZE and resident == pages
    assert gone is None and unmapped is None


def test_a_file_that_cannot_be_mapped_keeps_nothing(tmp_path):
    present = weights_file(tmp_path)

    async def go():
        keeper = WeightKeeper()
        try:
            keeper.keep("alpha", [present, tmp_path / "missing.gguf"])
        except OSError as exc:
            return exc, keeper.kept("alpha"), mapping(present)
        return None, keeper.kept("alpha"), mapping(present)

    error, kept, held = asyncio.run(go())
    assert isinstance(error, FileNotFoundError) and kept is None and held is None


# Run in a process of its own that may not lock memory: CAP_IPC_LOCK dropped (as root has it) and RLIMIT_MEMLOCK at
# 64 KiB, below the file's size.
UNPRIVILEGED = """
import asyncio, ctypes, json, resource, sys
from pathlib import Path
from orchestrator.supervisor.keeper import WeightKeeper
from tests.unit.test_keeper import mapping, resident_pages

class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
libc = ctypes.CDLL(None, use_errno=True)
header, data = Header(0x20080522, 0), (Data * 2)()
assert libc.capget(ctypes.byref(header), data) == 0
CAP_IPC_LOCK = 14
data[0].effective &= ~(1 << CAP_IPC_LOCK)
data[0].permitted &= ~(1 << CAP_IPC_LOCK)
assert libc.capset(ctypes.byref(header), data) == 0
resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))

async def go(path):
    keeper = WeightKeeper()
    keeper.keep("alpha", [path])
    await keeper.settled("alpha")
    held = mapping(path)
    resident, pages = resident_pages(held["address"], held["length"])
    kept = keeper.kept("alpha")
    await keeper.drop("alpha")
    return {"bytes": kept.bytes, "pinned": kept.pinned, "locked_kb": held["locked_kb"], "resident": resident,
            "pages": pages, "mapped_after_drop": mapping(path) is not None}

print(json.dumps(asyncio.run(go(Path(sys.argv[1])))))
"""


def test_where_mlock_is_refused_weights_stay_mapped_and_resident_unpinned(tmp_path):
    path = weights_file(tmp_path)
    done = subprocess.run([sys.executable, "-c", UNPRIVILEGED, str(path)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["bytes"] == SIZE and report["pinned"] is False and report["locked_kb"] == 0
    assert report["resident"] == report["pages"] and not report["mapped_after_drop"]
