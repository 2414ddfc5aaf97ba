"""What a soak run's traffic found, counted per server and kind: requests sent, answered as they must be, by
expected variant (a cut stream, an unload refused while busy), and failures by label with their first
examples."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench.soak.requests import Outcome

EXAMPLES_KEPT = 3


@dataclass
class KindCounts:
    sent: int = 0
    ok: int = 0
    notes: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, outcome: Outcome) -> None:
        self.sent += 1
        if outcome.failure is None:
            self.ok += 1
            if outcome.note:
                self.notes[outcome.note] += 1
            return
        self.failures[outcome.failure] += 1
        kept = self.examples.setdefault(outcome.failure, [])
        if len(kept) < EXAMPLES_KEPT:
            kept.append(outcome.detail)

    def report(self) -> dict:
        return {"sent": self.sent, "ok": self.ok, "notes": dict(self.notes), "failures": dict(self.failures),
                "examples": self.examples}


class Tally:
    """Counts per (server, kind), and the statuses each invalid request got."""

    def __init__(self) -> None:
        self.kinds: dict[str, dict[str, KindCounts]] = defaultdict(lambda: defaultdict(KindCounts))
        self.bad_statuses: dict[str, Counter] = defaultdict(Counter)  # bad request name -> statuses seen

    def add(self, server: str, outcome: Outcome) -> None:
        self.kinds[server][outcome.kind].add(outcome)

    @property
    def failures(self) -> int:
        return sum(sum(k.failures.values()) for kinds in self.kinds.values() for k in kinds.values())

    def report(self) -> dict:
        return {
            "servers": {server: {kind: counts.report() for kind, counts in sorted(kinds.items())}
                        for server, kinds in sorted(self.kinds.items())},
            "failures": self.failures,
            "bad_request_statuses": {name: dict(sorted(seen.items())) for name, seen in sorted(self.bad_statuses.items())},
        }
