"""Prefix reuse for the llamacpp backend: sequence slots that keep their KV cells after a request ends, and a
host-RAM prompt cache of sequence states (like llama-server's `--cache-ram`).

A new request takes the free slot whose cached tokens share the longest prefix with its prompt, or, when a
saved state in RAM shares a longer one, the least recently used free slot with that state restored into it;
either way only the tokens after the shared prefix are computed. When a request ends, its slot's tokens and
KV cells stay where they are, and a copy of its state goes to the RAM cache, which evicts least recently used
entries beyond its byte budget. Only cells and states of the request's own cache salt are reused (a slot
of another salt counts as sharing nothing; RAM entries are kept by salt and tokens), so one key never reads
another's prefix. The decisions here are pure; the backend's loop makes the llama.cpp calls.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

MIN_SAVED_TOKENS = 16  # shorter sequences are cheaper to recompute than to keep


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    left, right = np.asarray(a[:n], dtype=np.int64), np.asarray(b[:n], dtype=np.int64)
    differ = np.flatnonzero(left != right)
    return int(differ[0]) if differ.size else n


@dataclass(slots=True)
class Slot:
    """One llama.cpp sequence: which tokens its KV cells hold now, and who uses it."""

    seq: int
    tokens: list[int] = field(default_factory=list)  # tokens whose K and V are in the cache, in order
    owner: str | None = None  # the running request's id; None when free (its cells are a cached prefix)
    salt: str = ""  # the cache salt of the request that computed its cells: only that salt reuses them
    last_used: int = 0  # step counter of its last use (least recently used goes first)


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """Where a new request goes: its slot, a RAM entry to restore into it first (or None), and how many
    prompt tokens are already computed there."""

    slot: Slot
    restore: tuple[int, ...] | None
    reuse: int


def place(prompt: tuple[int, ...], salt: str, free: list[Slot], saved: list[tuple[int, ...]],
          running: frozenset[int] = frozenset()) -> SlotPlan:
    """Choose the slot for `prompt` of cache salt `salt` among the free slots (at least one), and whether to
    restore a saved state (`saved`: the RAM entries of that salt). Among slots that reuse as much, and for a
    restore: a slot next to a running sequence's (`running`: their ids, given with a KV stream per slot), then
    the least recently used. llama.cpp computes a step's sequences in one pass over the weights only where their
    ids are consecutive, so running sequences kept side by side share passes (four sequences scattered over 16
    slots took four); the least recently used keeps other cached prefixes longest.

    At least one prompt token is always left to compute: its logits give the first output token."""
    limit = len(prompt) - 1

    def reusable(slot: Slot) -> int:
        return min(common_prefix(slot.tokens, prompt), limit) if slot.salt == salt else 0

    def beside(slot: Slot) -> bool:
        return slot.seq - 1 in running or slot.seq + 1 in running

    best_slot = max(free, key=lambda s: (reusable(s), beside(s), -s.last_used))
    slot_reuse = reusable(best_slot)
    best_saved, saved_reuse = None, 0
    for tokens in saved:
        reuse = min(common_prefix(tokens, prompt), limit)
        if reuse > saved_reuse:
            best_saved, saved_reuse = tokens, reuse
    if best_saved is not None and saved_reuse > slot_reuse:
        oldest = min(free, key=lambda s: (not beside(s), s.last_used, len(s.tokens)))
        return SlotPlan(oldest, best_saved, saved_reuse)
    return SlotPlan(best_slot, None, slot_reuse)


def worth_saving(tokens: list[int], saved: list[tuple[int, ...]]) -> bool:
    """Whether a finished sequence's state adds anything to the RAM cache."""
    if len(tokens) < MIN_SAVED_TOKENS:
        return False
    return not any(len(entry) >= len(tokens) and common_prefix(entry, tokens) == len(tokens) for entry in saved)


class RamPromptCache:
    """Sequence states (KV cells copied to host memory, as `Context.seq_state` writes them: writable buffers that
    `set_seq_state` reads in place) by their cache salt and tokens, least recently used evicted first."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], bytearray] = OrderedDict()

    def keys(self, salt: str) -> list[tuple[int, ...]]:
        """The tokens of every entry of cache salt `salt`."""
        return [tokens for entry_salt, tokens in self._entries if entry_salt == salt]

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, salt: str, tokens: tuple[int, ...], state: bytearray) -> None:
        """Keep `state`; entries of the salt whose tokens are a prefix of `tokens` are dropped (this one covers
        them)."""
        if len(state) > self.budget_bytes:
            return
        for key in [k for k in self.keys(salt) if len(k) <= len(tokens) and tokens[: len(k)] == k]:
            self.bytes -= len(self._entries.pop((salt, key)))
        self._entries[(salt, tokens)] = state
        self.bytes += len(state)
        while self.bytes > self.budget_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= len(dropped)

    def take(self, salt: str, tokens: tuple[int, ...]) -> bytearray:
        """The state saved for exactly `tokens` of `salt`, marked as recently used."""
        self._entries.move_to_end((salt, tokens))
        return self._entries[(salt, tokens)]
