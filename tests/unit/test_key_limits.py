"""Per-key limits with plain numbers for time: token buckets for requests and tokens per minute, concurrent
requests counted by choices, Retry-After, tokens reserved on admission (prompt and every choice's max_tokens) and
what was not used given back at the end, debt past the reservation's cap, everything given back when a request
never ran."""

from __future__ import annotations

import pytest

from orchestrator.access.keys import KeyPolicy
from orchestrator.access.limits import KeyLimiter, TokenBucket
from orchestrator.errors import RateLimited


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_refills_continuously_up_to_a_minute_and_may_go_into_debt():
    bucket = TokenBucket(60, now=0.0)
    bucket.take(60, 0.0)
    assert bucket.wait_s(1, 0.0) == pytest.approx(1.0)
    assert bucket.level(30.0) == pytest.approx(30.0)
    assert bucket.level(1000.0) == 60.0  # never more than a minute's allowance
    bucket.take(90, 1000.0)
    assert bucket.wait_s(30, 1000.0) == pytest.approx(60.0)


def test_requests_per_minute():
    clock = Clock()
    limiter = KeyLimiter(KeyPolicy("k", requests_per_minute=2), clock)
    limiter.admit()
    limiter.admit()
    with pytest.raises(RateLimited, match="key 'k' is over its limit of 2 requests per minute") as refused:
        limiter.admit()
    assert refused.value.retry_after_s == pytest.approx(30.0)
    clock.now = 30.0
    limiter.admit()
    assert limiter.running == 3


def test_concurrent_requests():
    limiter = KeyLimiter(KeyPolicy("k", max_concurrent=1), Clock())
    limiter.admit()
    with pytest.raises(RateLimited, match="already has 1 requests running \\(its limit is 1\\)") as refused:
        limiter.admit()
    assert refused.value.retry_after_s == 1.0
    limiter.finish(0, 0)
    limiter.admit()


def test_a_reservation_is_capped_at_a_minute_and_a_longer_completion_leaves_debt():
    clock = Clock()
    limiter = KeyLimiter(KeyPolicy("k", tokens_per_minute=600), clock)  # 10 a second
    limiter.admit()
    taken = limiter.admit_tokens(100, 5000)
    assert taken == 600  # at most a minute's allowance: it waited for a full bucket, and runs
    limiter.finish(taken, 100 + 700)  # 700 generated: the bucket is 200 in debt
    limiter.admit()
    with pytest.raises(RateLimited, match=r"this request reserves 50 .*; retry in 25\.0 s") as refused:
        limiter.admit_tokens(50)
    assert refused.value.retry_after_s == pytest.approx(25.0)
    limiter.finish(0, 0)
    clock.now = 25.0
    limiter.admit()
    assert limiter.admit_tokens(50) == 50


def test_a_request_that_never_ran_gives_its_prompt_back_and_a_prompt_over_a_minute_never_runs():
    limiter = KeyLimiter(KeyPolicy("k", tokens_per_minute=100), Clock())
    limiter.admit()
    taken = limiter.admit_tokens(100)
    limiter.finish(taken, 0)
    assert limiter.now().tokens_left == 100
    limiter.admit()
    with pytest.raises(RateLimited, match="the prompt has 101 tokens, more than key 'k' may use in a minute") as never:
        limiter.admit_tokens(101)
    assert never.value.retry_after_s is None


def test_choices_count_against_concurrent_requests_and_come_back_together():
    limiter = KeyLimiter(KeyPolicy("k", max_concurrent=4), Clock())
    limiter.admit(4)  # n = 4 holds all four
    assert limiter.now().running == 4
    with pytest.raises(RateLimited, match=r"already has 4 requests running \(its limit is 4\)") as busy:
        limiter.admit()
    assert busy.value.retry_after_s is not None
    limiter.finish(0, 0, choices=4)
    limiter.admit(3)
    with pytest.raises(RateLimited, match=r"and this request has 2 choices \(n\)"):
        limiter.admit(2)
    with pytest.raises(RateLimited, match=r"asks for 5 choices \(n\), more than key 'k' may run at once") as never:
        limiter.admit(5)
    assert never.value.retry_after_s is None


def test_tokens_per_minute_reserve_every_choice_on_admission_and_refund_what_was_unused():
    clock = Clock()
    limiter = KeyLimiter(KeyPolicy("k", tokens_per_minute=1000), clock)
    limiter.admit(4)
    assert limiter.admit_tokens(100, 4 * 200) == 900  # the prompt and max_tokens x n
    assert limiter.now().tokens_left == 100
    limiter.admit()
    with pytest.raises(RateLimited, match="this request reserves 150"):  # a burst cannot outrun the reservation
        limiter.admit_tokens(50, 100)
    limiter.finish(0, 0)
    limiter.finish(900, 100 + 4 * 25, choices=4)  # each choice stopped after 25 tokens
    assert limiter.now().tokens_left == 800  # 1000 - 200 used: the unused 700 came back
