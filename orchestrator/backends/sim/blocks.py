"""The paged KV cache as TensorRT-LLM keeps it, in block counts: refcounted blocks, prefix reuse of full
blocks by content hash, and the reservations GUARANTEED_NO_EVICT makes at admission.

A full block of prompt tokens is known by the hash of its tokens chained to the hash of the block before
it, so a hit means the whole prefix up to it is the same. A block nobody references any more keeps its
content (and its hash) while it waits in the free pool, least recently used first; it is reused by the
next prompt that starts the same way, or overwritten when a fresh block is needed and no empty one is left.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def prefix_hashes(tokens: Sequence[int], tokens_per_block: int, blocks: int) -> list[int]:
    """The chained content hashes of the first `blocks` full blocks of `tokens`."""
    hashes, previous = [], 0
    for start in range(0, blocks * tokens_per_block, tokens_per_block):
        previous = hash((previous, tuple(tokens[start : start + tokens_per_block])))
        hashes.append(previous)
    return hashes


class BlockPool:
    def __init__(self, total: int):
        self.total = total
        self._refs = [0] * total
        self._hash_of: list[int | None] = [None] * total
        self._empty: list[int] = list(range(total - 1, -1, -1))  # free, holding nothing worth keeping
        self._cached: OrderedDict[int, None] = OrderedDict()  # free, holding a reusable block; oldest first
        self._by_hash: dict[int, int] = {}
        self.reserved = 0  # blocks promised to admitted sequences and not yet allocated
        self.reused = 0  # prefix hits since the start, in blocks

    @property
    def free(self) -> int:
        return len(self._empty) + len(self._cached)

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def available(self) -> int:
        """Free blocks nobody has been promised: what admission may take."""
        return self.free - self.reserved

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """The blocks holding the longest cached prefix of these hashes."""
        found = []
        for key in hashes:
            block = self._by_hash.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def idle_count(self, blocks: Sequence[int]) -> int:
        """How many of these blocks sit in the free pool (sharing them takes them out of it)."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def share(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks for one more sequence: a prefix hit."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._cached[block]
            self._refs[block] += 1
        self.reused += len(blocks)

    def reserve(self, count: int) -> None:
        self.reserved += count

    def unreserve(self, count: int) -> None:
        self.reserved -= count

    def allocate(self) -> int:
        """A fresh block against a reservation: an empty one, else the least recently used cached one."""
        if self._empty:
            block = self._empty.pop()
        else:
            block, _ = self._cached.popitem(last=False)
            del self._by_hash[self._hash_of[block]]
            self._hash_of[block] = None
        self._refs[block] = 1
        self.reserved -= 1
        return block

    def register(self, block: int, key: int) -> None:
        """Make a full prompt block reusable by later prompts with the same prefix."""
        if key not in self._by_hash and self._hash_of[block] is None:
            self._by_hash[key] = block
            self._hash_of[block] = key

    def release(self, blocks: Sequence[int]) -> None:
        """One sequence lets go of its blocks; unreferenced ones keep their content in the free pool."""
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._hash_of[block] is None:
                    self._empty.append(block)
                else:
                    self._cached[block] = None
