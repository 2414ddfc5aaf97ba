"""Every scheduling decision, with plain data."""

from __future__ import annotations

import pytest

from orchestrator.scheduler.policy import (
    Admission,
    Memory,
    ModelLoad,
    Placement,
    Resident,
    admit,
    backoff_s,
    idle_unload_delay,
    pick_next,
    plan_load,
)
from orchestrator.scheduler.settings import Priority

GiB = 2**30


def model(name="m", running=0, queued=0, max_concurrency=4, max_queue=8, weight=1.0, head=None, arrival=0):
    return ModelLoad(name, running, queued, max_concurrency, max_queue, weight, head, arrival)


# -- admission ----------------------------------------------------------------------------------------------
def test_runs_when_model_and_device_have_room():
    assert admit(model(running=3), total_running=3, max_running_total=10) is Admission.RUN


def test_queues_when_the_model_is_full():
    assert admit(model(running=4), total_running=4, max_running_total=10) is Admission.QUEUE


def test_queues_when_the_device_is_full():
    assert admit(model(running=0), total_running=10, max_running_total=10) is Admission.QUEUE


def test_queues_behind_its_own_waiters_even_with_room():
    assert admit(model(running=1, queued=1), total_running=1, max_running_total=10) is Admission.QUEUE


def test_rejects_when_the_queue_is_full():
    assert admit(model(running=4, queued=8), total_running=4, max_running_total=10) is Admission.REJECT


def test_zero_queue_still_runs_when_there_is_room():
    assert admit(model(running=0, max_queue=0), total_running=0, max_running_total=10) is Admission.RUN
    assert admit(model(running=4, max_queue=0), total_running=4, max_running_total=10) is Admission.REJECT


# -- picking the next waiter ----------------------------------------------------------------------------------
def test_nothing_to_pick_when_the_device_is_full():
    assert pick_next([model(head=Priority.INTERACTIVE)], total_running=10, max_running_total=10) is None


def test_nothing_to_pick_without_waiters():
    assert pick_next([model()], total_running=0, max_running_total=10) is None


def test_a_full_model_is_skipped():
    busy = model("busy", running=4, head=Priority.INTERACTIVE)
    other = model("other", running=0, head=Priority.INTERACTIVE, arrival=9)
    assert pick_next([busy, other], 4, 10) == "other"


def test_interactive_waiters_go_before_batch_across_models():
    batch = model("batch", running=0, head=Priority.BATCH, arrival=1)
    interactive = model("chat", running=3, head=Priority.INTERACTIVE, arrival=5)
    assert pick_next([batch, interactive], 3, 10) == "chat"


def test_fair_share_prefers_the_model_running_less_per_weight():
    heavy = model("heavy", running=3, head=Priority.INTERACTIVE, arrival=1)
    light = model("light", running=1, head=Priority.INTERACTIVE, arrival=2)
    assert pick_next([heavy, light], 4, 10) == "light"


def test_weights_scale_the_share():
    big = model("big", running=3, weight=4.0, head=Priority.INTERACTIVE, arrival=2)  # 0.75 per weight
    small = model("small", running=1, weight=1.0, head=Priority.INTERACTIVE, arrival=1)  # 1.0 per weight
    assert pick_next([big, small], 4, 10) == "big"


def test_ties_go_to_the_oldest_waiter():
    a = model("a", running=1, head=Priority.INTERACTIVE, arrival=7)
    b = model("b", running=1, head=Priority.INTERACTIVE, arrival=3)
    assert pick_next([a, b], 2, 10) == "b"


def test_a_busy_model_cannot_starve_another_over_many_grants():
    """Hand out 12 permits one by one to two always-waiting models: they alternate."""
    running = {"a": 0, "b": 0}
    order = []
    for turn in range(12):
        views = [model(n, running=r, max_concurrency=100, head=Priority.INTERACTIVE, arrival=turn) for n, r in running.items()]
        chosen = pick_next(views, sum(running.values()), 100)
        running[chosen] += 1
        order.append(chosen)
    assert running == {"a": 6, "b": 6}


# -- placement ------------------------------------------------------------------------------------------------
def resident(name, gib, idle=True, pinned=False, last_used=0.0, host_gib=0):
    return Resident(name, Memory(int(gib * GiB), int(host_gib * GiB)), pinned, idle, last_used)


def gib(device, host=0):
    return Memory(int(device * GiB), int(host * GiB))


def test_loads_when_it_fits():
    assert plan_load(gib(2), gib(3), gib(10), []).placement is Placement.LOAD


def test_evicts_idle_models_least_recently_used_first():
    residents = [resident("new", 3, last_used=30), resident("old", 3, last_used=10), resident("mid", 3, last_used=20)]
    plan = plan_load(gib(5), gib(1), gib(10), residents)
    assert plan.placement is Placement.EVICT
    assert plan.evict == ("old", "mid")


def test_never_evicts_pinned_or_busy_models():
    residents = [resident("pinned", 4, pinned=True, last_used=1), resident("busy", 4, idle=False, last_used=2),
                 resident("idle", 2, last_used=3)]
    plan = plan_load(gib(3), gib(1.5), gib(10), residents)
    assert plan.placement is Placement.EVICT and plan.evict == ("idle",)


def test_waits_when_only_busy_models_hold_the_memory():
    plan = plan_load(gib(3), gib(1), gib(10), [resident("busy", 4, idle=False)])
    assert plan.placement is Placement.WAIT
    assert "busy" in plan.reason


def test_blocked_when_pinned_models_hold_the_memory():
    plan = plan_load(gib(3), gib(1), gib(10), [resident("keep", 8, pinned=True)])
    assert plan.placement is Placement.BLOCKED
    assert "keep" in plan.reason


def test_impossible_when_larger_than_the_device():
    plan = plan_load(gib(11), gib(10), gib(10), [])
    assert plan.placement is Placement.IMPOSSIBLE
    assert "11.00 GiB" in plan.reason and "10.00 GiB" in plan.reason


def test_host_ram_is_refused_as_device_memory_is():
    plan = plan_load(gib(2, host=9), gib(8, host=20), gib(10, host=8), [])
    assert plan.placement is Placement.IMPOSSIBLE
    assert "9.00 GiB of pinned host RAM and the host offers 8.00 GiB" in plan.reason
    assert "on the device" not in plan.reason and "the device offers" not in plan.reason


def test_loads_only_when_device_and_host_both_fit():
    assert plan_load(gib(2, host=4), gib(3, host=4), gib(10, host=16), []).placement is Placement.LOAD
    pinned = [resident("pinned", 1, pinned=True, host_gib=12)]
    plan = plan_load(gib(2, host=5), gib(3, host=4), gib(10, host=16), pinned)
    assert plan.placement is Placement.BLOCKED
    assert "5.00 GiB of pinned host RAM and they leave 4.00 GiB" in plan.reason and "pinned" in plan.reason


def test_evicts_until_the_host_tier_fits_too():
    """The device has room, the host has not: idle models are evicted for their host RAM, oldest first."""
    residents = [resident("old", 1, last_used=1, host_gib=2), resident("mid", 1, last_used=2, host_gib=4),
                 resident("new", 1, last_used=3, host_gib=8)]
    plan = plan_load(gib(1, host=6), gib(5, host=1), gib(10, host=16), residents)
    assert plan.placement is Placement.EVICT and plan.evict == ("old", "mid")


def test_waits_for_busy_models_holding_host_ram():
    plan = plan_load(gib(1, host=6), gib(5, host=1), gib(10, host=16), [resident("busy", 1, idle=False, host_gib=8)])
    assert plan.placement is Placement.WAIT and "busy" in plan.reason


# -- failures and idleness --------------------------------------------------------------------------------------
@pytest.mark.parametrize("failures, delay", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 4), (8, 60), (30, 60)])
def test_backoff_grows_then_caps(failures, delay):
    assert backoff_s(failures) == delay


def test_idle_unload_delay():
    assert idle_unload_delay(300, pinned=False) == 300
    assert idle_unload_delay(0, pinned=False) == 0
    assert idle_unload_delay(-1, pinned=False) is None
    assert idle_unload_delay(300, pinned=True) is None
