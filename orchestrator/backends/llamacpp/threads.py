"""How many threads each llamacpp step runs on, learned from the steps themselves (runs in the engine thread).

llama.cpp's threads wait for each other at every operation of a step by spinning, so whether a step is faster on
every core or on all cores but one depends on the machine, on the step's size and on what else needs a core (the
HTTP process, this worker's event loop, other processes): on one 2-core machine a single sequence decoded at 132.5
tok/s with 1 thread and 14.3 with 2, sixteen at 186.2 and 328.6; on another, one sequence ran faster on 2
(docs/llamacpp.md, "Threads"). No fixed rule is right on both. So the engine times each candidate count on steps
of each size class (1, 2-3, 4-7, 8-15, 16-31, 32 and more tokens), interleaved, `TRIES` steps each, then runs
that class on the faster (by median time per token), and every `RETRY_EVERY` steps of the class times the others
again, since the machine's load changes; sooner where one step on another count, every `PROBE_EVERY` steps, finds
it much faster than its timings say (tries made while something else took a core pick the count that suffers
least from that, and would keep it long after). Steps of more than `TRY_TOKENS` tokens are never tries: one on the
slower count costs its whole length (a 600-token step took a second longer on 1 thread than on 2), so they run
on the fastest count timed so far, or on the most threads before any is. Nor is a class tried while the nearest
smaller class that settled runs on the most threads: a larger step spreads better over threads than a smaller one
(on the machines measured, the smaller steps were the ones faster on fewer), and a prompt's step on the slower
count costs tens of milliseconds of its time to first token. `--worker.threads N` runs every step on N.
"""

from __future__ import annotations

import statistics
from collections import deque

SIZE_CLASSES = 6  # steps of 1, 2-3, 4-7, 8-15, 16-31, 32+ tokens
TRIES = 8  # steps each candidate is timed on, per size class, before the faster one is kept
RETRY_EVERY = 4096  # steps of a class after which the slower candidates are timed again
TRY_TOKENS = 256  # larger steps run on the best count known, never as a try
PROBE_EVERY = 512  # steps of a tried class between single steps on another count (0.2% of steps, on the slower)
STALE = 0.75  # a probe faster than this times the count's median: the machine changed since those were timed
RECHOOSE_EVERY = TRIES  # steps of a tried class between looks at its medians (~50 µs a look after a decode)


def size_class(tokens: int) -> int:
    return min(SIZE_CLASSES - 1, max(tokens, 1).bit_length() - 1)


def pick(candidates: tuple[int, ...], times: dict[int, deque[float]]) -> int:
    """The thread count for the next step of a class: a candidate not yet timed `TRIES` times (the least timed
    first, so the tries interleave), else the fastest by median seconds per token."""
    untried = [c for c in candidates if len(times.get(c, ())) < TRIES]
    if untried:
        return min(untried, key=lambda c: len(times.get(c, ())))
    return min(candidates, key=lambda c: statistics.median(times[c]))


class ThreadTuner:
    def __init__(self, candidates: tuple[int, ...]):
        self.candidates = candidates
        self._times: list[dict[int, deque[float]]] = [{} for _ in range(SIZE_CLASSES)]
        self._steps = [0] * SIZE_CLASSES
        self._kept: list[int | None] = [None] * SIZE_CLASSES  # a class's count once tried, between looks

    @classmethod
    def fixed(cls, threads: int) -> ThreadTuner:
        return cls((threads,))

    @classmethod
    def default(cls, cores: int) -> ThreadTuner:
        """All cores but one (one left to the serving path) or all of them, whichever is faster per step size."""
        return cls(tuple(sorted({max(1, cores - 1), max(1, cores)})))

    @property
    def most(self) -> int:
        return max(self.candidates)

    def choose(self, tokens: int) -> int:
        if len(self.candidates) == 1:
            return self.candidates[0]
        k = size_class(tokens)
        self._steps[k] += 1
        times = self._times[k]
        kept = self._kept[k]
        if self._steps[k] % RETRY_EVERY == 0:  # the others are timed again; a class never settled starts afresh
            self._times[k] = times = {kept: times[kept]} if kept is not None else {}
            self._kept[k] = kept = None
        if kept is not None and self._steps[k] % PROBE_EVERY == 0 and tokens <= TRY_TOKENS:
            return next(c for c in self.candidates if c != kept)  # one step: are its timings out of date?
        if kept is not None and self._steps[k] % RECHOOSE_EVERY:
            return kept
        below = [c for c in self._kept[:k] if c is not None]
        if kept is None and below and below[-1] == self.most:
            return self.most  # smaller steps run faster on every thread: larger ones gain more from them, untried
        if tokens > TRY_TOKENS:
            timed = [c for c in self.candidates if times.get(c)]
            return min(timed, key=lambda c: statistics.median(times[c])) if timed else self.most
        choice = pick(self.candidates, times)
        if all(len(times.get(c, ())) >= TRIES for c in self.candidates):
            self._kept[k] = choice
        return choice

    def observe(self, tokens: int, threads: int, seconds: float) -> None:
        """A step of `tokens` tokens took `seconds` on `threads` threads."""
        if len(self.candidates) > 1 and tokens > 0:
            k, per_token = size_class(tokens), seconds / tokens
            times = self._times[k].setdefault(threads, deque(maxlen=TRIES))
            if self._kept[k] not in (None, threads) and per_token < STALE * statistics.median(times):
                times.clear()  # a probe ran much faster than this count's timings say: time it again in full
                self._kept[k] = None
            times.append(per_token)

    def describe(self) -> str:
        if len(self.candidates) == 1:
            return f"{self.candidates[0]} threads"
        return f"{' or '.join(map(str, self.candidates))} threads, whichever is faster per step size"
