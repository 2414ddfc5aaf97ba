"""The memory ledger, on this machine's real memory with a configured capacity."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.scheduler.ledger import HostProbe, MemoryLedger

MiB = 2**20


def test_capacity_reserve_and_free():
    ledger = MemoryLedger(HostProbe(), capacity_bytes=1000 * MiB, reserve_bytes=100 * MiB)
    assert ledger.usable == 900 * MiB
    ledger.reserve_for("a", 300 * MiB)
    assert ledger.used == 300 * MiB
    assert ledger.free() == 600 * MiB
    ledger.release("a")
    assert ledger.free() == 900 * MiB


def test_default_reserve_is_a_tenth():
    assert MemoryLedger(HostProbe(), capacity_bytes=1000, reserve_bytes=None).reserve == 100


def test_measurement_replaces_the_estimate_now_and_next_time():
    ledger = MemoryLedger(HostProbe(), capacity_bytes=64 * 2**30, reserve_bytes=0)
    estimate = ledger.estimate("a", weights_bytes=10 * MiB, kv_bytes=5 * MiB, overhead_bytes=1 * MiB)
    assert estimate == 16 * MiB
    ledger.reserve_for("a", estimate)
    measured = ledger.commit("a", os.getpid())
    assert measured == ledger.footprint("a") and measured > 16 * MiB  # this Python process is bigger
    ledger.release("a")
    assert ledger.estimate("a", 10 * MiB, 5 * MiB, 1 * MiB) == measured


def test_memory_is_confirmed_returned_only_once_the_process_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ledger = MemoryLedger(HostProbe(), capacity_bytes=2**30, reserve_bytes=0)
    assert not ledger.returned(child.pid)
    child.stdin.close()
    child.wait()
    assert ledger.returned(child.pid)
