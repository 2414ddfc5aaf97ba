"""The KV cache's prefix reuse inside the test double of TensorRT-LLM's Executor, as 1.2's KV cache manager
does it (the facts table's "prefix reuse" facts, read in kvCacheManager.cpp):

- a request's context has ceil(L / tokens_per_block) blocks for its L prompt tokens. Its first L - 1 tokens
  are cut into blocks (the last one may be partial; one more, empty, block when L % tokens_per_block == 1):
  the last prompt token is never reused, it is always computed again;
- walking from the root of the reuse tree, a block whose tokens equal a stored block after the same prefix
  is reused; a matched block that is not full ends the walk. With partial reuse on, the first block that
  matches no stored block exactly may still match one on a common leading run of tokens: it counts as a
  whole reused block, and ends the walk. Every other block is missed;
- blocks are stored for reuse: the full blocks of a prompt's first L - 1 tokens once its context phase is
  done, each block of generated tokens as it fills, and at release every block of the sequence's first
  (tokens - 1) tokens, the partial last one included;
- every block's key carries its request's `cache_salt_id` (None when it has none), and blocks match only
  with equal salts (BlockKey in 1.2 compares the salt before any token), so the double keeps one reuse tree
  per salt.

The double keeps at most `capacity` stored blocks and drops the least recently used first, with the blocks
stored after it. It does not hold blocks that running sequences use, nor model reference counts (so it
refuses copy_on_partial_reuse=False, where only unreferenced leaf blocks may be partially reused).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockReuse:
    """How a request's context blocks were found: as a request's kv_cache_metrics count them."""

    reused: int = 0
    missed: int = 0
    allocated: int = 0  # blocks taken from the free pool: missed ones, and a partially matched block's copy


@dataclass(eq=False)
class _Block:
    tokens: tuple[int, ...]
    parent: _Block | None
    children: dict[tuple[int, ...], _Block] = field(default_factory=dict)


class PrefixCache:
    def __init__(self, tokens_per_block: int, capacity: int, *, reuse: bool, partial: bool):
        self.tokens_per_block = tokens_per_block
        self._capacity = capacity
        self._reuse = reuse
        self._partial = partial
        self._roots: dict[int | None, _Block] = {}  # the root of each cache salt's reuse tree
        self._recent: OrderedDict[_Block, None] = OrderedDict()  # stored blocks, least recently used first

    def context_blocks(self, prompt_len: int) -> int:
        return -(-prompt_len // self.tokens_per_block)

    def _root(self, salt: int | None) -> _Block:
        return self._roots.setdefault(salt, _Block((), None))

    def match(self, prompt: list[int], salt: int | None = None) -> BlockReuse:
        """Find a new request's context blocks (when its first context chunk is scheduled), among those of its
        cache salt."""
        total = self.context_blocks(len(prompt))
        if not self._reuse:
            return BlockReuse(allocated=total)  # reuse off: blocks are allocated, none counted reused or missed
        node, reused, copied = self._root(salt), 0, 0
        for key in self._keys(prompt, len(prompt) - 1, partial=True):
            found, whole = self._find(node, key)
            if found is None:
                break
            reused += 1
            self._recent.move_to_end(found)
            if not whole:
                copied = 1  # the partially matched block is copied into a block of its own
                break
            node = found
        missed = total - reused
        return BlockReuse(reused=reused, missed=missed, allocated=missed + copied)

    def store(self, tokens: list[int], salt: int | None = None, *, partial: bool) -> None:
        """Make the blocks of `tokens[:-1]` reusable by requests of cache salt `salt`: full ones only, or the
        partial last one too."""
        if not self._reuse or len(tokens) < 2:
            return
        node = self._root(salt)
        for key in self._keys(tokens, len(tokens) - 1, partial=partial):
            block = node.children.get(key)
            if block is None:
                block = _Block(key, node)
                node.children[key] = block
            self._recent[block] = None
            self._recent.move_to_end(block)
            node = block
        while len(self._recent) > self._capacity:
            self._drop(next(iter(self._recent)))

    def _find(self, node: _Block, key: tuple[int, ...]) -> tuple[_Block | None, bool]:
        """The stored block `key` reuses after `node`, and whether the walk may go on past it."""
        if not key or not node.children:
            return None, False
        exact = node.children.get(key)
        if exact is not None:
            return exact, len(exact.tokens) == self.tokens_per_block
        if not self._partial:
            return None, False
        best, best_run = None, 0
        for stored, block in node.children.items():
            run = _common_run(stored, key)
            if run > best_run:
                best, best_run = block, run
        return best, False

    def _keys(self, tokens: list[int], usable: int, *, partial: bool) -> list[tuple[int, ...]]:
        """`tokens[:usable]` in blocks; a partial last block only when `partial`. (A prompt whose last token
        starts a block has one more, empty, context block: it never matches, so it is only counted.)"""
        size = self.tokens_per_block
        keys = [tuple(tokens[start : start + size]) for start in range(0, usable, size)]
        if keys and len(keys[-1]) < size and not partial:
            keys.pop()
        return keys

    def _drop(self, block: _Block) -> None:
        for child in list(block.children.values()):
            self._drop(child)
        del block.parent.children[block.tokens]
        self._recent.pop(block, None)


def _common_run(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    run = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        run += 1
    return run
