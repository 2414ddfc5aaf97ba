"""Fairness between API keys on one model: each key's virtual token counter and the permits its requests hold.

A key's counter grows by the tokens served to it divided by its weight (a prompt token counts 1 and a generated
token 2, the weights of Sheng et al., OSDI 2024: decoding a token costs about twice what prefilling one does).
A running request is charged as it is served: its tokens so far count in every decision, and are settled into the
counter when its permit is given back; a prompt counts once whatever `n` (its choices share the prefill). A key
that becomes active (nothing running or queued on the model before) is lifted to the lowest counter of the keys
active there; when no key is active the counters are forgotten. A key stays present on the model for
`scheduling.key_presence_s` after it was last active there (see `policy.KeyLoad`). `policy.pick_key` decides
from these.

Without keys every caller is one key (`anonymous`), and admission is what it was without fairness.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from orchestrator.scheduler.policy import KeyLoad, lifted_counter

PROMPT_TOKEN_COST = 1.0
COMPLETION_TOKEN_COST = 2.0


@dataclass(frozen=True)
class Tenant:
    """Who a request is served for: its API key's name and weight (its share of a model, relative to others)."""

    key: str = "anonymous"
    weight: float = 1.0


ANONYMOUS_TENANT = Tenant()


class Metered(Protocol):
    """What fairness reads of a running request: the tokens served to it so far."""

    prompt_tokens: int

    @property
    def completion_tokens(self) -> int: ...


def cost(request: Metered) -> float:
    return PROMPT_TOKEN_COST * request.prompt_tokens + COMPLETION_TOKEN_COST * request.completion_tokens


class KeyShares:
    """One model's keys: their counters (settled), their running requests (charged as served) and weights."""

    def __init__(self, presence_s: float = 0.0) -> None:
        self._presence_s = presence_s
        self._settled: dict[str, float] = {}
        self._weights: dict[str, float] = {}
        self._serving: dict[str, dict[int, Metered]] = {}  # by id(): a finish is found at once among hundreds
        self._seen: dict[str, float] = {}  # when each key was last active here (the scheduler's clock)

    def counter(self, key: str) -> float:
        live = sum(cost(request) for request in self._serving.get(key, {}).values())
        return self._settled.get(key, 0.0) + live / self._weights.get(key, 1.0)

    def running(self, key: str) -> int:
        return len(self._serving.get(key, ()))

    def activate(self, tenant: Tenant, queued: Counter[str], now: float) -> None:
        """`tenant` arrives on the model: lift its counter if it was idle there (queued: waiters per key)."""
        self._weights[tenant.key] = tenant.weight
        self._seen[tenant.key] = now
        if self.running(tenant.key) or queued[tenant.key]:
            return
        loads = self.loads(queued, now)
        if not any(load.active for load in loads):
            self._settled.clear()  # nobody is active: the past no longer counts
        self._settled[tenant.key] = lifted_counter(self._settled.get(tenant.key, 0.0), loads)

    def start(self, tenant: Tenant, request: Metered) -> None:
        """The request took a permit: it is charged from now on."""
        self._weights[tenant.key] = tenant.weight
        self._serving.setdefault(tenant.key, {})[id(request)] = request

    def finish(self, tenant: Tenant, request: Metered, now: float) -> None:
        """The request gave its permit back: what it was served is settled into its key's counter."""
        self._seen[tenant.key] = now
        serving = self._serving.get(tenant.key, {})
        if serving.pop(id(request), None) is not None:
            self._settled[tenant.key] = self._settled.get(tenant.key, 0.0) + cost(request) / tenant.weight
        if not serving:
            self._serving.pop(tenant.key, None)

    def loads(self, queued: Counter[str], now: float) -> list[KeyLoad]:
        """Every known key's state, without its waiters' priorities (see `entries.ModelEntry.key_loads`).

        Counters are only ever compared between keys, so with one key known on the model its counter is its
        settled part alone: its running requests' tokens are summed (a pass over every one of them, on every
        admission) only where another key's counter is there to compare."""
        recent = {key for key, seen in self._seen.items() if now - seen <= self._presence_s}
        keys = set(self._settled) | set(self._serving) | set(queued) | recent
        counter = self.counter if len(keys) > 1 else lambda key: self._settled.get(key, 0.0)
        return [KeyLoad(key, self.running(key), queued[key], counter(key), self._weights.get(key, 1.0),
                        recent=key in recent) for key in keys]
