"""Kept weights in placement decisions (policy.plan_load, policy.plan_keep), with plain values: they are dropped
before any loaded model is evicted, least recently used first, only where they hold what a load lacks; they never
make a load wait or fail; an unloaded model's weights are kept within their budget and the free memory, making way
only for weights used less recently."""

from __future__ import annotations

from orchestrator.scheduler.policy import KeptWeights, Memory, Placement, Resident, plan_keep, plan_load

GiB = 2**30


def gib(device, host=0):
    return Memory(int(device * GiB), int(host * GiB))


def kept(name, device=0, host=0, last_used=0.0):
    return KeptWeights(name, gib(device, host), last_used)


def resident(name, device, idle=True, pinned=False, last_used=0.0):
    return Resident(name, gib(device), pinned, idle, last_used)


# -- plan_load ----------------------------------------------------------------------------------------------------
def test_kept_weights_are_dropped_least_recently_used_first_before_any_model_is_evicted():
    weights = [kept("newer", 2, last_used=5), kept("older", 2, last_used=1), kept("oldest", 1, last_used=0)]
    plan = plan_load(gib(4), gib(1), gib(10), [resident("idle", 4)], weights)
    assert (plan.placement, plan.drop, plan.evict) == (Placement.LOAD, ("oldest", "older"), ())
    assert "oldest, older" in plan.reason


def test_every_kept_weight_goes_before_an_eviction():
    plan = plan_load(gib(5), gib(1), gib(10), [resident("idle", 4)], [kept("a", 1, last_used=3)])
    assert (plan.placement, plan.drop, plan.evict) == (Placement.EVICT, ("a",), ("idle",))


def test_kept_weights_in_host_ram_are_not_dropped_for_device_memory():
    weights = [kept("in-host", host=8)]
    plan = plan_load(gib(4), gib(1, host=1), gib(10, host=16), [resident("idle", 4)], weights)
    assert (plan.placement, plan.drop, plan.evict) == (Placement.EVICT, (), ("idle",))


def test_kept_weights_in_host_ram_are_dropped_for_a_host_tier():
    weights = [kept("in-host", host=8)]
    plan = plan_load(gib(1, host=4), gib(5, host=1), gib(10, host=16), [], weights)
    assert (plan.placement, plan.drop) == (Placement.LOAD, ("in-host",))


def test_kept_weights_never_make_a_load_wait_or_fail():
    busy = [resident("busy", 4, idle=False)]
    assert plan_load(gib(3), gib(1), gib(10), busy, [kept("a", 2)]).placement is Placement.LOAD
    pinned = [resident("pinned", 4, pinned=True)]
    assert plan_load(gib(6), gib(1), gib(10), pinned, [kept("a", 5)]).placement is Placement.LOAD
    waiting = plan_load(gib(7), gib(1), gib(10), busy, [kept("a", 5)])
    assert waiting.placement is Placement.WAIT and waiting.drop == ()  # nothing dropped for a load that waits


def test_a_load_that_fits_drops_nothing():
    assert plan_load(gib(2), gib(3), gib(10), [], [kept("a", 5)]).drop == ()


# -- plan_keep ----------------------------------------------------------------------------------------------------
def test_weights_are_kept_within_the_budget_and_the_free_memory():
    assert plan_keep(kept("a", host=2), 4 * GiB, [], gib(0, host=3)).keep
    over_budget = plan_keep(kept("a", host=5), 4 * GiB, [], gib(0, host=8))
    assert not over_budget.keep and "budget" in over_budget.reason
    no_room = plan_keep(kept("a", host=2), 4 * GiB, [], gib(0, host=1))
    assert not no_room.keep


def test_keeping_drops_weights_used_less_recently_least_recently_used_first():
    weights = [kept("b", host=2, last_used=2), kept("c", host=2, last_used=1), kept("d", host=2, last_used=9)]
    plan = plan_keep(kept("a", host=3, last_used=5), 6 * GiB, weights, gib(0, host=10))
    assert plan.keep and plan.drop == ("c", "b")


def test_weights_used_more_recently_are_never_dropped_to_keep_others():
    weights = [kept("recent", host=3, last_used=9)]
    plan = plan_keep(kept("a", host=3, last_used=5), 4 * GiB, weights, gib(0, host=10))
    assert not plan.keep and plan.drop == ()


def test_on_the_host_device_kept_weights_count_on_the_device():
    plan = plan_keep(kept("a", 2, last_used=5), 8 * GiB, [kept("old", 3)], gib(1))
    assert plan.keep and plan.drop == ("old",)
