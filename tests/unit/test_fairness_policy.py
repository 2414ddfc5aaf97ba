"""Fairness between API keys as pure decisions: whose waiter goes next on a model (virtual token counters, each
key's share of the permits, a permit kept free for a present key), each key's share of the queue, and a returning
key's counter lifted to the active ones'."""

from __future__ import annotations

from orchestrator.scheduler.policy import (
    Admission,
    KeyLoad,
    ModelLoad,
    admit,
    kept_free,
    lifted_counter,
    may_take,
    pick_key,
    share,
)
from orchestrator.scheduler.settings import Priority

NOW, LATER = Priority.INTERACTIVE, Priority.BATCH


def waiting(key: str, counter: float = 0.0, running: int = 0, queued: int = 1, weight: float = 1.0,
            priority: Priority = NOW, arrival: int = 0) -> KeyLoad:
    return KeyLoad(key, running, queued, counter, weight, priority, arrival)


def full_model(queued: int, max_queue: int = 8) -> ModelLoad:
    return ModelLoad("m", running=4, queued=queued, max_concurrency=4, max_queue=max_queue, head_priority=NOW)


def test_the_key_with_the_fewest_virtual_tokens_goes_first():
    turn = pick_key([waiting("a", counter=500, arrival=0), waiting("b", counter=20, arrival=7)], max_concurrency=64, free=1)
    assert turn.key == "b"
    assert "fewest tokens" in turn.reason


def test_equal_counters_go_to_the_oldest_waiter():
    assert pick_key([waiting("a", 5, arrival=3), waiting("b", 5, arrival=1)], 64, 1).key == "b"


def test_priority_classes_come_before_counters():
    turn = pick_key([waiting("a", counter=900, priority=NOW), waiting("b", counter=0, priority=LATER)], 64, 1)
    assert turn.key == "a"


def test_a_key_holding_its_share_of_permits_waits_while_another_key_is_below_its_share():
    # a holds 3 of 4 permits (its share is 2) and has served fewer tokens than b: b still goes next
    keys = [waiting("a", counter=10, running=3), waiting("b", counter=400, running=0)]
    turn = pick_key(keys, max_concurrency=4, free=1)
    assert turn.key == "b"
    assert "below its share" in turn.reason


def test_a_key_over_its_share_still_goes_when_nobody_else_is_present():
    keys = [waiting("a", running=6), KeyLoad("gone", counter=0.0)]  # gone: neither active nor recent
    assert pick_key(keys, max_concurrency=8, free=1).key == "a"
    keys = [waiting("a", running=2, counter=1), waiting("b", running=2, counter=9)]  # both at their share of 4
    assert pick_key(keys, max_concurrency=4, free=1).key == "a"  # a permit is not left idle while both wait


def test_a_permit_is_kept_free_for_a_present_key_between_its_requests():
    flood = waiting("a", running=14)
    between = KeyLoad("b", recent=True)  # sent one request a moment ago, will send the next
    assert kept_free(flood, [flood, between], 16) == 1
    assert pick_key([flood, between], max_concurrency=16, free=2).key == "a"  # one left free for b
    assert pick_key([flood, between], max_concurrency=16, free=1) is None  # the last one is kept for b
    assert not may_take(flood, [flood, between], 16, free=1)
    running_b = KeyLoad("b", running=1)  # b's request runs: nothing more is kept for it beyond its share
    assert may_take(flood, [flood, running_b], 16, free=1) is False  # b is below its share (8): still kept
    at_share = KeyLoad("b", running=8)
    assert may_take(flood, [flood, at_share], 16, free=1)
    below_share = waiting("a", running=3)
    assert may_take(below_share, [below_share, between], 16, free=1)  # below its own share: always


def test_nothing_to_pick_without_waiters():
    assert pick_key([KeyLoad("a", running=3)], 4, 1) is None


def test_shares_follow_weights_among_active_keys():
    a, b = KeyLoad("a", running=1, weight=3.0), KeyLoad("b", queued=1, weight=1.0)
    idle = KeyLoad("c", weight=4.0)  # not present: takes no share
    assert share(8, a, [a, b, idle]) == 6
    assert share(8, b, [a, b, idle]) == 2
    assert share(8, idle, [a, b, idle]) == 4  # a key arriving counts itself
    assert share(1, b, [a, b]) == 1  # never less than one
    assert share(0, b, [a, b]) == 0  # of nothing, nothing: max_queue = 0 refuses every waiter, as without keys
    recent = KeyLoad("c", weight=4.0, recent=True)  # present for a while after its last request
    assert share(8, a, [a, b, recent]) == 3


def test_a_flooding_key_at_its_share_of_a_full_queue_is_refused_while_another_key_still_queues():
    flood = KeyLoad("a", running=4, queued=8)
    newcomer = KeyLoad("b")
    keys = [flood, newcomer]
    assert admit(full_model(queued=8), 4, 100, newcomer, keys) is Admission.QUEUE
    assert admit(full_model(queued=9), 4, 100, flood, keys) is Admission.REJECT


def test_below_a_full_queue_every_key_queues_as_before():
    flood = KeyLoad("a", running=4, queued=7)
    assert admit(full_model(queued=7), 4, 100, flood, [flood, KeyLoad("b", queued=0, running=1)]) is Admission.QUEUE


def test_a_flooding_key_waits_rather_than_take_the_permit_kept_for_another():
    model = ModelLoad("m", running=15, queued=0, max_concurrency=16, max_queue=8)
    flood, between = KeyLoad("a", running=15), KeyLoad("b", recent=True)
    assert admit(model, 15, 100, flood, [flood, between]) is Admission.QUEUE
    assert admit(model, 15, 100, between, [flood, between]) is Admission.RUN


def test_one_key_has_the_whole_queue_as_without_keys():
    only = KeyLoad("anonymous", running=4, queued=8)
    assert admit(full_model(queued=8), 4, 100, only, [only]) is Admission.REJECT
    assert admit(full_model(queued=8), 4, 100) is Admission.REJECT
    assert admit(full_model(queued=7), 4, 100, KeyLoad("anonymous", running=4, queued=7), []) is Admission.QUEUE
    nobody_waits = KeyLoad("anonymous", running=4)
    assert admit(full_model(queued=0, max_queue=0), 4, 100, nobody_waits, [nobody_waits]) is Admission.REJECT


def test_a_returning_key_is_lifted_to_the_lowest_active_counter_and_never_lowered():
    active = [KeyLoad("a", running=2, counter=1000.0), KeyLoad("b", queued=1, counter=700.0)]
    idle = [KeyLoad("c", counter=5.0)]
    assert lifted_counter(10.0, active + idle) == 700.0  # idle time is not banked
    assert lifted_counter(2000.0, active) == 2000.0
    assert lifted_counter(10.0, idle) == 10.0  # nobody active: nothing to catch up with
