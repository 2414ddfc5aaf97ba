"""The simulated engine as a pure state machine: tokens, admission, chunked prefill, prefix reuse, cancels."""

from __future__ import annotations

import math

import pytest

from orchestrator.backends.sim.step_time import CALIBRATED
from orchestrator.engine.request import EngineRequest, FinishReason, SamplingParams
from orchestrator.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter
from tests.sim.conftest import CORPUS, make_engine, request, run_to_end, tokens

FP8 = CALIBRATED["fp8"]


def test_greedy_requests_read_the_corpus_from_its_start():
    engine = make_engine()
    engine.add(request("g", max_new=12, greedy=True, ignore_eos=True))
    deltas, _ = run_to_end(engine)
    assert tokens(deltas["g"]) == list(CORPUS[:12])
    assert [len(d.token_ids) for d in deltas["g"]] == [1] * 12  # one token per step
    assert deltas["g"][-1].finish is FinishReason.LENGTH
    assert [d.finish for d in deltas["g"]].count(None) == 11


def test_the_same_seed_gives_the_same_tokens_whatever_else_runs():
    alone = make_engine()
    alone.add(request("a", seed=42, max_new=15, ignore_eos=True))
    busy = make_engine()
    for index in range(5):
        busy.add(request(f"other{index}", prompt=5 + index, seed=index, max_new=7))
    busy.add(request("a", seed=42, max_new=15, ignore_eos=True))
    other_seed = make_engine()
    other_seed.add(request("a", seed=43, max_new=15, ignore_eos=True))
    first, second, third = (tokens(run_to_end(engine)[0]["a"]) for engine in (alone, busy, other_seed))
    assert first == second and first != third and len(first) == 15


def test_without_ignore_eos_a_request_ends_on_an_end_token_after_its_natural_length():
    lengths = []
    for seed in range(40):
        engine = make_engine(natural_length=20)
        engine.add(request("r", seed=seed, max_new=100))
        deltas = run_to_end(engine)[0]["r"]
        assert deltas[-1].finish is FinishReason.STOP and deltas[-1].token_ids == []  # the end token is not text
        lengths.append(len(tokens(deltas)))
    assert min(lengths) >= 10 and max(lengths) <= 30 and len(set(lengths)) > 5


def test_min_tokens_holds_back_the_end():
    engine = make_engine(natural_length=4)
    engine.add(request("r", seed=1, max_new=100, min_tokens=50))
    deltas = run_to_end(engine)[0]["r"]
    assert len(tokens(deltas)) == 50 and deltas[-1].finish is FinishReason.STOP


def test_stop_token_ids_end_the_sequence_and_are_not_part_of_it():
    engine = make_engine()
    engine.add(request("r", greedy=True, max_new=100, ignore_eos=True, stop_token_ids=(CORPUS[6],)))
    deltas = run_to_end(engine)[0]["r"]
    assert tokens(deltas) == list(CORPUS[:6]) and deltas[-1].finish is FinishReason.STOP


def test_stop_tokens_before_min_tokens_are_skipped():
    engine = make_engine()
    engine.add(request("r", greedy=True, max_new=100, ignore_eos=True, min_tokens=10, stop_token_ids=(CORPUS[6],)))
    out = tokens(run_to_end(engine)[0]["r"])
    assert out == list(CORPUS[:6]) + list(CORPUS[7:101])  # the stop token masked; met again only after max_tokens


def test_synthetic_logprobs_are_deterministic_and_consistent():
    def run():
        engine = make_engine()
        engine.add(request("r", seed=7, max_new=8, ignore_eos=True, logprobs=True, top_logprobs=3))
        return run_to_end(engine)[0]["r"]

    first, second = run(), run()
    assert [d.logprobs for d in first] == [d.logprobs for d in second]
    for delta in first:
        (token,), (logprob,), (top,) = delta.token_ids, delta.logprobs, delta.top_logprobs
        assert -1.45 <= logprob <= -0.05
        assert len(top) == 3 and (token, logprob) in top and len({t for t, _ in top}) == 3
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert sum(math.exp(lp) for _, lp in top) <= 1.0 + 1e-9


def test_guaranteed_no_evict_reserves_prompt_and_max_new_and_makes_the_rest_wait():
    engine = make_engine(tokens_per_block=4, blocks=16)
    for name in ("a", "b", "c"):  # each needs (8 + 24) / 4 = 8 blocks: two fit, the third waits
        engine.add(request(name, prompt=8, max_new=24, seed=ord(name), ignore_eos=True))
    first = engine.step()
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (2, 1)
    assert engine.pool.reserved + engine.pool.used == 16  # everything is promised, little allocated yet
    _, results = run_to_end(engine)
    results.insert(0, first)
    steps = {name: [i for i, r in enumerate(results) for d in r.deltas if d.request_id == name] for name in "abc"}
    assert steps["c"][0] > min(steps["a"][-1], steps["b"][-1])  # c started only once a or b had finished
    assert [len(steps[name]) for name in "abc"] == [24, 24, 24]


def test_a_request_that_can_never_fit_the_cache_is_refused():
    engine = make_engine(tokens_per_block=4, blocks=16)
    with pytest.raises(InvalidRequest, match="need 72 tokens of KV cache; this model's cache holds 64"):
        engine.check(request("big", prompt=8, max_new=64))


def test_max_batch_size_and_priorities_decide_who_runs():
    engine = make_engine(max_batch_size=1)
    engine.add(request("low", max_new=3, ignore_eos=True, priority=-1))
    engine.add(request("mid", max_new=3, ignore_eos=True))
    engine.add(request("high", max_new=3, ignore_eos=True, priority=5))
    engine.add(request("mid2", max_new=3, ignore_eos=True))
    _, results = run_to_end(engine)
    order = []
    for result in results:
        for delta in result.deltas:
            if delta.request_id not in order:
                order.append(delta.request_id)
    assert order == ["high", "mid", "mid2", "low"]
    assert all(len(result.deltas) <= 1 for result in results)  # one at a time


def test_prefill_is_chunked_within_max_num_tokens_after_the_decode_rows():
    engine = make_engine(max_num_tokens=16, tokens_per_block=4)
    engine.add(request("long", prompt=40, max_new=5, ignore_eos=True))
    step_ms = [engine.step().step_ms for _ in range(3)]  # 16 + 16 + 8 prompt tokens; the last also decodes
    assert step_ms == pytest.approx([
        FP8.step_ms(0, 0, [(16, 0)]), FP8.step_ms(0, 0, [(16, 16)]), FP8.step_ms(0, 0, [(8, 32)]),
    ])
    engine.add(request("next", prompt=tuple(range(100, 140)), max_new=5, ignore_eos=True))
    result = engine.step()  # one decode row leaves 15 tokens: the chunk ends on a block boundary, 12
    assert result.step_ms == pytest.approx(FP8.step_ms(1, 41, [(12, 0)]))


def test_a_repeated_prompt_reuses_its_full_blocks_and_says_so_once():
    engine = make_engine(tokens_per_block=4)
    prompt = tuple(range(1, 41))
    engine.add(request("first", prompt=prompt, max_new=3, ignore_eos=True))
    first, _ = run_to_end(engine)
    engine.add(request("again", prompt=prompt, max_new=3, ignore_eos=True))
    engine.add(request("shares", prompt=prompt[:20] + tuple(range(100, 120)), max_new=3, ignore_eos=True))
    later, results = run_to_end(engine)
    assert [d.cached_tokens for d in first["first"]] == [0, None, None]
    assert later["again"][0].cached_tokens == 36  # 9 of 10 blocks: the last prompt token is always computed
    assert later["shares"][0].cached_tokens == 20
    assert [d.cached_tokens for d in later["again"][1:]] == [None, None]
    assert engine.stats().kv_blocks_reused == 9 + 5
    assert results[0].step_ms == pytest.approx(FP8.step_ms(0, 0, [(4, 36), (20, 20)]))


def test_cancelling_ends_waiting_and_running_requests_at_the_next_step():
    engine = make_engine(max_batch_size=1)
    engine.add(request("running", max_new=1000, ignore_eos=True))
    engine.add(request("waiting", max_new=10, ignore_eos=True))
    engine.step()
    engine.step()
    engine.cancel("running")
    engine.cancel("waiting")
    engine.cancel("unknown")
    result = engine.step()
    finals = {d.request_id: d for d in result.deltas}
    assert set(finals) == {"running", "waiting"}
    assert all(d.finish is FinishReason.CANCELLED and d.token_ids == [] for d in finals.values())
    assert not engine.busy and engine.pool.used == 0 and engine.pool.reserved == 0
    engine.cancel("running")  # finished already: ignored
    assert not engine.busy


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        (SamplingParams(logit_bias=((5, 1.0),)), "logit_bias"),
        (SamplingParams(presence_penalty=0.5), "presence_penalty"),
        (SamplingParams(frequency_penalty=-0.1), "frequency_penalty"),
        (SamplingParams(repetition_penalty=1.2), "repetition_penalty"),
    ],
)
def test_sampling_it_cannot_honour_is_refused(sampling, param):
    with pytest.raises(UnsupportedParameter) as refused:
        make_engine().check(EngineRequest("r", (1, 2, 3), 5, sampling))
    assert refused.value.param == param


def test_prompts_outside_the_limits_are_refused():
    engine = make_engine(max_seq_len=64)
    with pytest.raises(ContextLengthExceeded, match="100 tokens; this model takes 1 to 63"):
        engine.check(request("r", prompt=100))
    with pytest.raises(ContextLengthExceeded):
        engine.check(EngineRequest("r", (), 5))


def test_stats_follow_the_engine():
    engine = make_engine(tokens_per_block=4, blocks=64)
    engine.add(request("r", prompt=10, max_new=7, ignore_eos=True))
    engine.step()
    stats = engine.stats(step_latency_ms=1.5)
    assert (stats.running, stats.waiting, stats.iterations) == (1, 0, 1)
    assert (stats.kv_blocks_total, stats.kv_blocks_used, stats.kv_blocks_free) == (64, 3, 61)  # 11 tokens
    assert stats.iteration_latency_ms == 1.5 and stats.tokens_per_block == 4
    run_to_end(engine)
    assert engine.stats().kv_blocks_used == 0 and engine.stats().iterations == 7


def test_blocks_are_reused_only_within_one_cache_salt():
    engine = make_engine(tokens_per_block=4)
    prompt = tuple(range(1, 41))
    cached = {}
    for rid, salt in (("alice", "a"), ("bob", "b"), ("anonymous", ""), ("alice-again", "a")):
        engine.add(request(rid, prompt=prompt, max_new=3, ignore_eos=True, cache_salt=salt))
        deltas, _ = run_to_end(engine)
        cached[rid] = deltas[rid][0].cached_tokens
    assert cached == {"alice": 0, "bob": 0, "anonymous": 0, "alice-again": 36}
def _turn_after_eviction(host_blocks: int) -> tuple[int, float]:
    """A 40-token prompt, then another that overwrites its blocks, then the first again: (the third request's
    cached tokens, the step time of the step that admits it)."""
    engine = make_engine(blocks=16, host_blocks=host_blocks, onboard_ms_per_block=0.05)
    conversation, other = tuple(range(1, 41)), tuple(range(500, 560))  # other takes all 16 blocks
    for rid, prompt in (("first", conversation), ("other", other)):
        engine.add(request(rid, prompt, max_new=4, greedy=True))
        run_to_end(engine)
    engine.add(request("again", conversation, max_new=4, greedy=True))
    deltas, results = run_to_end(engine)
    return deltas["again"][0].cached_tokens, results[0].step_ms


def test_a_prompt_evicted_to_the_host_tier_is_reused_at_the_cost_of_a_copy():
    lost_cached, lost_ms = _turn_after_eviction(host_blocks=0)
    kept_cached, kept_ms = _turn_after_eviction(host_blocks=32)
    assert lost_cached == 0 and kept_cached == 36  # every full block but the last prompt token's
    onboard_ms = 9 * 0.05  # nine 4-token blocks copied back
    recompute = CALIBRATED["fp8"].step_ms(0, 0, [(40, 0)]) - CALIBRATED["fp8"].step_ms(0, 0, [(4, 36)])
    assert kept_ms == pytest.approx(lost_ms - recompute + onboard_ms)


def _next_turn_cached(retain: bool) -> int:
    """One conversation (a two-block system prompt, then its user's turn), a later one, then a long request that
    overwrites three cached blocks, the least recently used first; then the first conversation's next turn."""
    engine = make_engine(blocks=16, retain_system_prompt=retain)
    system = tuple(range(1, 9))
    engine.add(request("first", system + tuple(range(100, 108)), max_new=4, greedy=True, system_prefix_tokens=8))
    run_to_end(engine)
    for rid, prompt in (("later", tuple(range(300, 316))), ("long", tuple(range(500, 540)))):
        engine.add(request(rid, prompt, max_new=4, greedy=True))
        run_to_end(engine)
    engine.add(request("next turn", system + tuple(range(200, 220)), max_new=4, greedy=True, system_prefix_tokens=8))
    deltas, _ = run_to_end(engine)
    return deltas["next turn"][0].cached_tokens


def test_a_kept_system_prompt_survives_what_evicts_the_rest():
    assert _next_turn_cached(retain=False) == 4  # the system prompt's second block was the oldest left
    assert _next_turn_cached(retain=True) == 8  # kept: the later conversation's blocks went instead
