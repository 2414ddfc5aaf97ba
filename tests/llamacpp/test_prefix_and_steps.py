"""Pure decisions of the llamacpp backend: how the KV cells are laid out, where a prompt goes (prefix reuse), what
the RAM prompt cache keeps, and what one engine step computes."""

from __future__ import annotations

from orchestrator.backends.llamacpp.backend import kv_layout
from orchestrator.backends.llamacpp.cache import RamPromptCache, Slot, common_prefix, place, worth_saving
from orchestrator.backends.llamacpp.step import plan_step
from orchestrator.backends.llamacpp.threads import (
    PROBE_EVERY,
    RETRY_EVERY,
    TRIES,
    TRY_TOKENS,
    ThreadTuner,
    size_class,
)


def test_common_prefix():
    assert common_prefix([1, 2, 3], (1, 2, 4)) == 2
    assert common_prefix([1, 2], (1, 2, 3)) == 2
    assert common_prefix([], (1,)) == 0
    assert common_prefix([5], (1,)) == 0


def test_a_prompt_goes_to_the_free_slot_sharing_its_longest_prefix():
    slots = [Slot(0, [9, 9, 9], last_used=1), Slot(1, [1, 2, 3, 7], last_used=5), Slot(2, [1, 2], last_used=9)]
    placement = place((1, 2, 3, 4, 5), "", slots, [])
    assert placement.slot.seq == 1 and placement.reuse == 3 and placement.restore is None


def test_at_least_one_prompt_token_is_left_to_compute():
    placement = place((1, 2, 3), "", [Slot(0, [1, 2, 3, 4])], [])
    assert placement.reuse == 2


def test_a_longer_saved_prefix_is_restored_into_the_least_recently_used_free_slot():
    slots = [Slot(0, [1, 2], last_used=7), Slot(1, [8, 8, 8], last_used=2)]
    placement = place((1, 2, 3, 4, 5), "", slots, [(1, 2, 3, 4, 9), (6,)])
    assert placement.slot.seq == 1 and placement.restore == (1, 2, 3, 4, 9) and placement.reuse == 4


def test_without_a_shared_prefix_the_least_recently_used_slot_is_taken():
    slots = [Slot(0, [5], last_used=7), Slot(1, [6], last_used=2), Slot(2, [7], last_used=4)]
    assert place((1, 2), "", slots, []).slot.seq == 1


def test_among_equals_a_slot_beside_a_running_sequence_is_taken_so_running_ids_stay_consecutive():
    slots = [Slot(3, [1, 2, 9], last_used=7), Slot(5, [1, 2, 8], last_used=2), Slot(9, [1, 7], last_used=1)]
    assert place((1, 2, 3, 4), "", slots, [], running=frozenset({2})).slot.seq == 3  # reuse 2 both: beside 2
    assert place((1, 2, 3, 4), "", slots, []).slot.seq == 5  # nothing beside: the least recently used
    assert place((1, 2, 3, 4), "", slots, [], running=frozenset({10})).slot.seq == 5  # reuse comes first
    placement = place((1, 2, 3, 4), "", slots, [(1, 2, 3, 9)], running=frozenset({10}))
    assert placement.slot.seq == 9 and placement.restore == (1, 2, 3, 9)  # restored beside 10


def test_only_new_and_long_enough_sequences_are_saved():
    long = list(range(40))
    assert worth_saving(long, [])
    assert not worth_saving(list(range(5)), [])
    assert not worth_saving(long, [tuple(range(50))])  # a saved entry already covers it
    assert worth_saving(long, [tuple(range(20))])


def test_the_prompt_cache_keeps_its_budget_and_drops_covered_prefixes():
    cache = RamPromptCache(budget_bytes=100)
    cache.put("", (1, 2), b"a" * 30)
    cache.put("", (1, 2, 3), b"b" * 30)  # covers (1, 2)
    assert cache.keys("") == [(1, 2, 3)] and cache.bytes == 30
    cache.put("", (4,), b"c" * 40)
    cache.take("", (1, 2, 3))  # now the most recently used
    cache.put("", (5,), b"d" * 40)  # over budget: (4,) goes
    assert cache.keys("") == [(1, 2, 3), (5,)] and cache.bytes == 70
    cache.put("", (6,), b"e" * 101)  # larger than the whole budget: not kept
    assert cache.keys("") == [(1, 2, 3), (5,)]


def test_a_slot_or_saved_state_of_another_cache_salt_is_never_reused():
    slots = [Slot(0, [1, 2, 3, 4], salt="alice", last_used=9), Slot(1, [8], salt="bob", last_used=2)]
    placement = place((1, 2, 3, 4, 5), "bob", slots, [])
    assert placement.reuse == 0 and placement.slot.seq == 1
    assert place((1, 2, 3, 4, 5), "alice", slots, []).reuse == 4
    cache = RamPromptCache(budget_bytes=100)
    cache.put("alice", (1, 2, 3), b"a" * 10)
    cache.put("bob", (1, 2), b"b" * 10)  # another salt's entry covers nothing of alice's
    assert cache.keys("alice") == [(1, 2, 3)] and cache.keys("bob") == [(1, 2)] and cache.keys("") == []
    assert cache.take("bob", (1, 2)) == b"b" * 10


def test_decoding_sequences_come_first_and_prompts_fill_the_rest_in_chunks():
    plan = plan_step([("a", 1), ("b", 300), ("c", 1), ("d", 50)], n_batch=512, prefill_while_decoding=128)
    assert plan.decode == ("a", "c")
    assert plan.prefill == (("b", 128), ("d", 50))  # while others decode a prompt takes at most 128 tokens a step
    assert plan.tokens == 180


def test_while_others_decode_prompts_together_take_at_most_one_pass():
    """A burst of short prompts is computed in one step beside the decoding sequences, up to `n_ubatch` prompt
    tokens; without decoding sequences the whole batch is theirs."""
    burst = [("a", 1)] + [(f"p{i}", 40) for i in range(15)]
    plan = plan_step(burst, n_batch=2048, prefill_while_decoding=128, n_ubatch=512)
    assert plan.decode == ("a",)
    assert [count for _, count in plan.prefill] == [40] * 12 + [32]
    assert plan_step(burst[1:], n_batch=2048, prefill_while_decoding=128, n_ubatch=512).tokens == 600


def test_without_decoding_sequences_prompts_take_the_whole_batch():
    plan = plan_step([("b", 300), ("d", 400)], n_batch=512, prefill_while_decoding=128)
    assert plan.decode == () and plan.prefill == (("b", 300), ("d", 212))


def test_a_full_batch_of_decodes_leaves_no_room_for_prompts():
    plan = plan_step([(str(i), 1) for i in range(8)] + [("p", 10)], n_batch=8)
    assert len(plan.decode) == 8 and plan.prefill == ()


def run_steps(tuner: ThreadTuner, tokens: int, seconds_on: dict[int, float], steps: int) -> list[int]:
    """Steps of `tokens` tokens that take `seconds_on[threads]` each; the thread counts they ran on."""
    chosen = []
    for _ in range(steps):
        threads = tuner.choose(tokens)
        tuner.observe(tokens, threads, seconds_on[threads])
        chosen.append(threads)
    return chosen


def test_each_step_size_tries_both_counts_interleaved_then_keeps_the_faster():
    tuner = ThreadTuner.default(cores=2)
    assert tuner.candidates == (1, 2) and tuner.most == 2
    chosen = run_steps(tuner, 1, {1: 0.007, 2: 0.070}, 2 * TRIES + 20)
    assert chosen[:4] == [1, 2, 1, 2] and chosen[2 * TRIES:] == [1] * 20  # one token: 1 thread is faster here
    chosen = run_steps(tuner, 16, {1: 0.050, 2: 0.030}, 2 * TRIES + 20)
    assert chosen[2 * TRIES:] == [2] * 20  # sixteen tokens, another size class: 2 threads are
    assert run_steps(tuner, 1, {1: 0.007, 2: 0.070}, 5) == [1] * 5  # each class keeps its own answer


def test_the_slower_count_is_timed_again_after_a_while_since_load_changes():
    tuner = ThreadTuner.default(cores=2)
    run_steps(tuner, 1, {1: 0.007, 2: 0.070}, RETRY_EVERY - 1)
    later = run_steps(tuner, 1, {1: 0.090, 2: 0.010}, 2 * TRIES + 10)  # the machine got busier: now 2 wins
    assert 2 in later[:TRIES] and later[-10:] == [2] * 10


def test_a_count_timed_while_the_machine_was_busy_is_tried_again_once_a_probe_finds_it_faster():
    tuner = ThreadTuner.default(cores=2)
    busy = run_steps(tuner, 1, {1: 0.040, 2: 0.090}, 2 * TRIES)  # something else took a core: 1 thread won
    assert sorted(busy) == [1] * TRIES + [2] * TRIES
    calm = run_steps(tuner, 1, {1: 0.039, 2: 0.019}, PROBE_EVERY + 2 * TRIES)
    assert calm[: PROBE_EVERY - 2 * TRIES - 1] == [1] * (PROBE_EVERY - 2 * TRIES - 1)
    assert calm[-TRIES:] == [2] * TRIES  # the probe on 2 threads was much faster: tried again, and kept


def test_larger_steps_are_not_tried_once_smaller_ones_run_on_every_thread():
    tuner = ThreadTuner.default(cores=2)
    assert run_steps(tuner, 64, {1: 0.05, 2: 0.04}, 2) == [1, 2]  # nothing settled yet: prompts try both
    run_steps(tuner, 1, {1: 0.039, 2: 0.019}, 2 * TRIES + 1)  # single tokens settle on 2 threads
    assert run_steps(tuner, 64, {1: 0.05, 2: 0.04}, 2 * TRIES) == [2] * 2 * TRIES
    other = ThreadTuner.default(cores=2)
    run_steps(other, 1, {1: 0.019, 2: 0.039}, 2 * TRIES + 1)  # single tokens settle on 1 thread
    assert sorted(run_steps(other, 64, {1: 0.05, 2: 0.04}, 2 * TRIES)) == [1] * TRIES + [2] * TRIES


def test_a_class_that_never_settled_reaches_its_retry_and_goes_on():
    """Prompt steps that are never tried (smaller steps run on every thread; or all longer than TRY_TOKENS) still
    count towards the retry, which must not need timings of every count."""
    tuner = ThreadTuner.default(cores=2)
    run_steps(tuner, 1, {1: 0.039, 2: 0.019}, 2 * TRIES + 1)
    assert set(run_steps(tuner, 64, {1: 1.0, 2: 0.5}, RETRY_EVERY + 10)) == {2}
    assert set(run_steps(ThreadTuner.default(cores=2), TRY_TOKENS + 1, {1: 1.0, 2: 0.5}, RETRY_EVERY + 10)) == {2}


def test_a_probe_that_agrees_with_the_timings_changes_nothing():
    tuner = ThreadTuner.default(cores=2)
    chosen = run_steps(tuner, 1, {1: 0.039, 2: 0.019}, 2 * TRIES + 2 * PROBE_EVERY)
    assert chosen[2 * TRIES :].count(1) == 2  # one probe per PROBE_EVERY steps, on the slower count


def test_steps_too_large_to_try_run_on_the_best_count_known():
    tuner = ThreadTuner.default(cores=2)
    big = TRY_TOKENS + 1
    assert run_steps(tuner, big, {1: 0.5, 2: 1.0}, 3) == [2, 2, 2]  # nothing timed on 1 thread: the most threads
    run_steps(tuner, 40, {1: 0.5, 2: 1.0}, 2 * TRIES)  # the same class's smaller steps try both counts
    assert run_steps(tuner, big, {1: 0.5, 2: 1.0}, 3) == [1, 1, 1]


def test_size_classes_are_powers_of_two():
    assert [size_class(n) for n in (1, 2, 3, 4, 7, 8, 16, 31, 32, 512)] == [0, 1, 1, 2, 2, 3, 4, 4, 5, 5]


def test_configured_threads_run_every_step_and_one_core_has_one_choice():
    tuner = ThreadTuner.fixed(3)
    assert run_steps(tuner, 1, {3: 0.01}, 3) == [3, 3, 3] and tuner.describe() == "3 threads"
    assert ThreadTuner.default(cores=1).candidates == (1,)
    assert ThreadTuner.default(cores=16).candidates == (15, 16)


def test_a_budget_holding_every_slot_at_full_length_gives_each_slot_a_stream():
    layout = kv_layout(budget_cells=40_000, max_batch_size=16, max_seq_len=2048)
    assert not layout.unified and layout.slots == 16 and layout.cells == 16 * 2048 and layout.seq_cells == 2048
    assert "a stream per slot" in layout.reason
    # A slot's stream is a whole number of llama.cpp's 256-cell pads: 1,000 tokens take 1,024 cells.
    padded = kv_layout(budget_cells=4 * 1024, max_batch_size=4, max_seq_len=1000)
    assert not padded.unified and padded.seq_cells == 1024


def test_a_smaller_budget_is_one_pool_that_any_sequence_may_fill():
    layout = kv_layout(budget_cells=11_520, max_batch_size=16, max_seq_len=2048)
    assert layout.unified and layout.slots == 16 and layout.cells == 11_520 and layout.seq_cells == 11_520
    assert "one pool" in layout.reason
