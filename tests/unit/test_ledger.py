"""The memory ledger, on this machine's real memory with a configured capacity."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.scheduler.ledger import DeviceReading, HostProbe, MemoryLedger
from orchestrator.scheduler.policy import Memory

MiB = 2**20
GiB = 2**30


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


def test_host_tier_is_its_own_resource_beside_a_gpu():
    """On a GPU, pinned host RAM is counted apart from the device: what each model's host tier holds, against the
    host's capacity less its reserve."""
    ledger = MemoryLedger(_Gpu(), 80 * GiB, 8 * GiB, host_capacity_bytes=64 * GiB, host_reserve_bytes=16 * GiB)
    assert ledger.usable_memory() == Memory(72 * GiB, 48 * GiB)
    ledger.reserve_for("a", 20 * GiB, host_bytes=16 * GiB)
    assert ledger.held("a") == Memory(20 * GiB, 16 * GiB)
    assert ledger.used == 20 * GiB and ledger.host_used == 16 * GiB
    assert ledger.room().device == 52 * GiB
    assert ledger.room().host == min(32 * GiB, HostProbe().read().free_bytes)
    ledger.release("a")
    assert ledger.host_used == 0


def test_host_tier_counts_on_the_device_when_the_device_is_the_host():
    """Models on the CPU: the prompt cache is host RAM like the rest of the model, so it is counted there, once."""
    ledger = MemoryLedger(HostProbe(), capacity_bytes=1000 * MiB, reserve_bytes=0, host_capacity_bytes=1000 * MiB)
    assert ledger.need(300 * MiB, 100 * MiB) == Memory(400 * MiB, 0)
    ledger.reserve_for("a", 300 * MiB, host_bytes=100 * MiB)
    assert ledger.used == 400 * MiB and ledger.held("a") == Memory(400 * MiB, 0)
    assert ledger.host_usable == 0 and ledger.host_used == 0


class _Gpu:
    """A device that is not the host, with all its memory free."""

    name = "cuda:0"

    def read(self) -> DeviceReading:
        return DeviceReading(80 * GiB, 0, 80 * GiB)

    def process_bytes(self, pid: int) -> int | None:
        return None


def test_kept_weights_are_host_ram_beside_a_gpu_within_their_budget():
    """Kept weights are a third holding: apart from models and host tiers, in host RAM, half of what the ledger offers
    of it by default; a model that loads again stops being kept."""
    ledger = MemoryLedger(_Gpu(), 80 * GiB, 8 * GiB, host_capacity_bytes=64 * GiB, host_reserve_bytes=16 * GiB)
    assert ledger.kept_budget == 24 * GiB
    ledger.reserve_for("a", 20 * GiB, host_bytes=4 * GiB)
    ledger.keep("b", 10 * GiB, last_used=1.0)
    assert ledger.kept_need(10 * GiB) == Memory(0, 10 * GiB) and ledger.kept_weights()[0].held == Memory(0, 10 * GiB)
    assert (ledger.used, ledger.host_used, ledger.kept_used) == (20 * GiB, 14 * GiB, 10 * GiB)
    assert ledger.footprint("b") == 0 and ledger.held("b") == Memory(0)  # not a loaded model
    assert ledger.reserve_for("b", 20 * GiB) is True  # its load uses them
    assert ledger.kept_used == 0 and ledger.kept_weights() == [] and ledger.reserve_for("c", GiB) is False


def test_kept_weights_count_on_the_device_when_the_device_is_the_host():
    ledger = MemoryLedger(HostProbe(), capacity_bytes=1000 * MiB, reserve_bytes=0, kept_budget_bytes=300 * MiB)
    ledger.reserve_for("a", 400 * MiB)
    ledger.keep("b", 250 * MiB, last_used=0.0)
    assert ledger.kept_need(250 * MiB) == Memory(250 * MiB, 0) and ledger.kept_budget == 300 * MiB
    assert ledger.used == 650 * MiB and ledger.host_used == 0
    assert ledger.drop("b") and not ledger.drop("b") and ledger.used == 400 * MiB
    assert MemoryLedger(HostProbe(), capacity_bytes=1000 * MiB, reserve_bytes=100 * MiB).kept_budget == 450 * MiB
