"""The paged KV cache as TensorRT-LLM keeps it, in block counts: refcounted blocks, prefix reuse of full
blocks by content hash, and the reservations GUARANTEED_NO_EVICT makes at admission.

A full block of prompt tokens is known by the hash of its tokens chained to the hash of the block before
it (the first one to the request's cache salt), so a hit means the whole prefix up to it is the same, for the
same salt. A block nobody references any more keeps its
content (and its hash) while it waits in the free pool, least recently used first; it is reused by the
next prompt that starts the same way, or overwritten when a fresh block is needed and no empty one is left.
A sequence frees its blocks last first, so the end of a prompt is overwritten before its beginning (a prefix
with a hole in it is worth only the part before the hole).

Blocks of high retention priority (a system prompt kept with `retain_system_prompt`) wait in a second free
list and are overwritten only when no block of default priority is left, as TensorRT-LLM's priority eviction
does. With a host tier (`host_blocks` > 0), the content of an overwritten reusable block is offloaded to host
RAM instead of being lost: the host keeps the newest `host_blocks` such blocks, and a prompt that reaches one
takes a fresh device block for it and copies it back (onboards it), which costs a transfer, not a prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def prefix_hashes(tokens: Sequence[int], tokens_per_block: int, blocks: int, salt: str = "") -> list[int]:
    """The chained content hashes of the first `blocks` full blocks of `tokens`. The chain starts from the
    request's cache salt, as TensorRT-LLM's first block hash mixes in its `cache_salt_id`: equal tokens of two
    salts never share a block."""
    hashes, previous = [], hash(salt) if salt else 0
    for start in range(0, blocks * tokens_per_block, tokens_per_block):
        previous = hash((previous, tuple(tokens[start : start + tokens_per_block])))
        hashes.append(previous)
    return hashes


class BlockPool:
    def __init__(self, total: int, host_blocks: int = 0):
        self.total = total
        self.host_blocks = host_blocks
        self._host: OrderedDict[int, None] = OrderedDict()  # hashes of blocks offloaded to host RAM, oldest first
        self._kept: OrderedDict[int, None] = OrderedDict()  # free, reusable, high retention priority; oldest first
        self._high = [False] * total  # the block holds high retention priority content
        self._refs = [0] * total
        self._hash_of: list[int | None] = [None] * total
        self._empty: list[int] = list(range(total - 1, -1, -1))  # free, holding nothing worth keeping
        self._cached: OrderedDict[int, None] = OrderedDict()  # free, holding a reusable block; oldest first
        self._by_hash: dict[int, int] = {}
        self.reserved = 0  # blocks promised to admitted sequences and not yet allocated
        self.reused = 0  # prefix hits since the start, in blocks (onboarded ones included)
        self.offloaded = 0  # blocks copied to the host tier since the start
        self.onboarded = 0  # blocks copied back from it

    @property
    def free(self) -> int:
        return len(self._empty) + len(self._cached) + len(self._kept)

    @property
    def host_used(self) -> int:
        return len(self._host)

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

    def locate(self, hashes: Sequence[int]) -> list[int | None]:
        """The longest cached prefix of these hashes, block by block: the device block holding it, or None where
        only the host tier holds it (it must be onboarded into a fresh block)."""
        found: list[int | None] = []
        for key in hashes:
            block = self._by_hash.get(key)
            if block is None and key not in self._host:
                break
            found.append(block)
        return found

    def onboard(self, keys: Sequence[int]) -> list[int]:
        """Fresh blocks (against a reservation) holding the host tier's copies of the blocks known by `keys`. They
        leave the host first, so that what the fresh blocks overwrite cannot push them out."""
        for key in keys:
            del self._host[key]
        blocks = [self.allocate() for _ in keys]
        for block, key in zip(blocks, keys, strict=True):
            self.register(block, key)
        self.onboarded += len(keys)
        self.reused += len(keys)
        return blocks

    def idle_count(self, blocks: Sequence[int]) -> int:
        """How many of these blocks sit in the free pool (sharing them takes them out of it)."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def share(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks for one more sequence: a prefix hit."""
        for block in blocks:
            if self._refs[block] == 0:
                del (self._kept if self._high[block] else self._cached)[block]
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
            block, _ = (self._cached or self._kept).popitem(last=False)
            self._offload(self._hash_of[block])
            del self._by_hash[self._hash_of[block]]
            self._hash_of[block] = None
            self._high[block] = False
        self._refs[block] = 1
        self.reserved -= 1
        return block

    def _offload(self, key: int) -> None:
        """An overwritten block's content goes to the host tier, which drops its oldest beyond its size."""
        if not self.host_blocks:
            return
        self._host[key] = None
        self._host.move_to_end(key)
        self.offloaded += 1
        if len(self._host) > self.host_blocks:
            self._host.popitem(last=False)

    def register(self, block: int, key: int) -> None:
        """Make a full prompt block reusable by later prompts with the same prefix."""
        if key not in self._by_hash and self._hash_of[block] is None:
            self._by_hash[key] = block
            self._hash_of[block] = key

    def release(self, blocks: Sequence[int], kept: int = 0) -> None:
        """One sequence lets go of its blocks, last first; unreferenced ones keep their content in the free pool,
        the first `kept` of them at high retention priority."""
        for index in range(len(blocks) - 1, -1, -1):
            block = blocks[index]
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._hash_of[block] is None:
                    self._empty.append(block)
                elif index < kept or self._high[block]:
                    self._high[block] = True
                    self._kept[block] = None
                else:
                    self._cached[block] = None
