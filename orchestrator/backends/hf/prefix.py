"""Which shared blocks of the transformers paged cache a request may reuse: only those its own cache salt computed.

transformers chains a block's hash to its parent's from the first block on, with nothing like a salt, so the
backend keeps beside it which salts each prompt block's hash was computed for (the blocks of every prompt
scheduled, by the same chained hash) and shows the cache's prefix search only the leading blocks its salt owns.
Identical blocks computed for two salts may still be merged by the cache afterwards: that saves memory and
tells no one anything, since both were computed. The table is bounded (least recently used hashes forgotten
first): a forgotten hash only means a block is computed again.
"""

from __future__ import annotations

from collections import OrderedDict


def _block_hash(parent: int | None, tokens: list[int]) -> int:
    from transformers.generation.continuous_batching.cache_allocators.cache_allocator import (
        compute_block_hash,
    )

    return compute_block_hash(parent, tokens)


class SaltedPrefixes:
    def __init__(self, tokens_per_block: int, capacity: int):
        self._tokens_per_block = tokens_per_block
        self._capacity = max(capacity, 1)
        self._salts: OrderedDict[int, set[str]] = OrderedDict()  # block hash -> salts whose prompts computed it
        self._salted = False  # a salt other than "" was seen: until then every request shares, as before

    def visible(self, salt: str, prompt_ids: list[int]) -> list[int]:
        """The part of `prompt_ids` the cache's prefix search may look at for a request of `salt`: its whole
        prompt while only the anonymous salt was seen, else its leading blocks this salt owns and one more
        token (the search matches at most (len - 1) // tokens_per_block blocks). Records the prompt's blocks
        as this salt's."""
        tpb = self._tokens_per_block
        self._salted = self._salted or salt != ""
        owned, parent, counting = 0, None, True
        for start in range(0, (len(prompt_ids) - 1) // tpb * tpb, tpb):
            parent = _block_hash(parent, prompt_ids[start : start + tpb])
            salts = self._salts.setdefault(parent, set())
            self._salts.move_to_end(parent)
            counting = counting and salt in salts
            owned += counting
            salts.add(salt)
        while len(self._salts) > self._capacity:
            self._salts.popitem(last=False)
        return prompt_ids[: owned * tpb + 1] if self._salted else prompt_ids
