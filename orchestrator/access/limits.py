"""Per-key limits: requests per minute and tokens per minute (token buckets), and concurrent requests.

A bucket holds up to a minute's allowance and refills continuously. Requests per minute take one each on
arrival. Concurrent requests count choices: a request with `n` = 4 holds four of them (one whose `n` exceeds
the limit can never run and is refused outright). Tokens per minute reserve, when the request is admitted, its
prompt's tokens and every choice's `max_tokens` (at most a whole minute's allowance: a request that may generate
more waits for a full bucket rather than never running; a prompt larger than a whole minute's allowance can never
run and is refused outright); when the request ends it is charged what it used, and what it did not use is given
back (a request that never reached its engine gives everything back). Using more than was reserved (possible only
past that cap) leaves the bucket in debt, which later requests wait out. Refusals are RateLimited (429) with the
seconds until the request would fit as its Retry-After.

Time is whatever the clock given says (monotonic seconds), so the rules are tested with plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.access.keys import KeyPolicy
from orchestrator.errors import RateLimited

RETRY_AFTER_CONCURRENCY_S = 1.0  # a running request's end cannot be foreseen; try again shortly


class TokenBucket:
    """Up to `per_minute` units, refilled at per_minute / 60 a second; may go below zero (debt)."""

    def __init__(self, per_minute: int, now: float):
        self.capacity = float(per_minute)
        self._rate = per_minute / 60.0
        self._level = self.capacity
        self._at = now

    def level(self, now: float) -> float:
        self._level = min(self.capacity, self._level + (now - self._at) * self._rate)
        self._at = now
        return self._level

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until `amount` units are there (0: now)."""
        return max(0.0, (amount - self.level(now)) / self._rate)

    def take(self, amount: float, now: float) -> None:
        """Take `amount` (negative: give back), whatever the level."""
        self._level = min(self.capacity, self.level(now) - amount)


@dataclass
class KeyUsageNow:
    """A key's live state, for /admin/usage."""

    running: int
    requests_left: float | None
    tokens_left: float | None


class KeyLimiter:
    """One key's limits. `admit` then `admit_tokens` on the way in; `finish` once at the end of every
    request that `admit` let in."""

    def __init__(self, policy: KeyPolicy, clock: Callable[[], float]):
        self.policy = policy
        self._clock = clock
        now = clock()
        self.running = 0
        self._requests = TokenBucket(policy.requests_per_minute, now) if policy.requests_per_minute else None
        self._tokens = TokenBucket(policy.tokens_per_minute, now) if policy.tokens_per_minute else None

    def admit(self, choices: int = 1) -> None:
        """Count a request of `choices` choices running, or raise RateLimited (concurrent requests, requests per
        minute; without Retry-After when it has more choices than the key may ever run at once)."""
        name, now = self.policy.name, self._clock()
        limit = self.policy.max_concurrent
        if limit is not None and choices > limit:
            raise RateLimited(f"the request asks for {choices} choices (n), more than key '{name}' may run at once "
                              f"({limit})")
        if limit is not None and self.running + choices > limit:
            raise RateLimited(
                f"key '{name}' already has {self.running} requests running (its limit is {limit})"
                + (f" and this request has {choices} choices (n)" if choices > 1 else "") + "; retry shortly",
                retry_after_s=RETRY_AFTER_CONCURRENCY_S,
            )
        if self._requests is not None:
            wait = self._requests.wait_s(1, now)
            if wait > 0:
                raise RateLimited(
                    f"key '{name}' is over its limit of {self.policy.requests_per_minute} requests per minute; "
                    f"retry in {wait:.1f} s",
                    retry_after_s=wait,
                )
            self._requests.take(1, now)
        self.running += choices

    def admit_tokens(self, prompt_tokens: int, max_tokens: int = 0) -> int:
        """Reserve the prompt's tokens and the most its choices may generate (`max_tokens`, summed over them) in
        the tokens-per-minute bucket, at most a minute's allowance; returns what was reserved (for `finish`).
        Raises RateLimited when they are not there yet, without Retry-After when the prompt never can be."""
        if self._tokens is None:
            return 0
        name, limit, now = self.policy.name, self.policy.tokens_per_minute, self._clock()
        if prompt_tokens > limit:
            raise RateLimited(
                f"the prompt has {prompt_tokens} tokens, more than key '{name}' may use in a minute ({limit})"
            )
        reserve = min(limit, prompt_tokens + max_tokens)
        wait = self._tokens.wait_s(reserve, now)
        if wait > 0:
            raise RateLimited(
                f"key '{name}' is over its limit of {limit} tokens per minute; this request reserves {reserve} "
                f"(its prompt, {prompt_tokens}, and up to {max_tokens} generated); retry in {wait:.1f} s",
                retry_after_s=wait,
            )
        self._tokens.take(reserve, now)
        return reserve

    def finish(self, taken: int, used: int, choices: int = 1) -> None:
        """The request of `choices` choices has ended: it used `used` tokens (0 if it never reached its engine)
        of which `taken` were reserved on admission; the difference is charged (or given back)."""
        self.running -= choices
        if self._tokens is not None:
            self._tokens.take(used - taken, self._clock())

    def now(self) -> KeyUsageNow:
        now = self._clock()
        return KeyUsageNow(
            running=self.running,
            requests_left=None if self._requests is None else round(self._requests.level(now), 3),
            tokens_left=None if self._tokens is None else round(self._tokens.level(now), 3),
        )


class KeyLimiters:
    """Every key's limiter, made on the key's first request."""

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self._by_name: dict[str, KeyLimiter] = {}

    def of(self, policy: KeyPolicy) -> KeyLimiter:
        limiter = self._by_name.get(policy.name)
        if limiter is None:
            limiter = self._by_name[policy.name] = KeyLimiter(policy, self._clock)
        return limiter

    def live(self) -> dict[str, KeyUsageNow]:
        return {name: limiter.now() for name, limiter in self._by_name.items()}
