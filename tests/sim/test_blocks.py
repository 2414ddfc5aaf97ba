"""The KV block pool: refcounts, reservations, prefix reuse by content hash, and what a free block keeps."""

from __future__ import annotations

from orchestrator.backends.sim.blocks import BlockPool, prefix_hashes


def test_allocations_come_from_reservations_and_go_back():
    pool = BlockPool(8)
    pool.reserve(3)
    assert (pool.free, pool.available, pool.used) == (8, 5, 0)
    blocks = [pool.allocate() for _ in range(2)]
    assert (pool.free, pool.available, pool.used, pool.reserved) == (6, 5, 2, 1)
    pool.release(blocks)
    pool.unreserve(1)
    assert (pool.free, pool.available, pool.used, pool.reserved) == (8, 8, 0, 0)


def test_prefix_hashes_chain_each_block_to_the_ones_before():
    first = prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    other_start = prefix_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4, 2)
    assert len(first) == 2 and first[1] != other_start[1]  # same tokens, different prefix
    assert prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, 2) == first


def test_a_registered_block_is_shared_by_refcount_and_kept_when_free():
    pool = BlockPool(4)
    pool.reserve(1)
    block = pool.allocate()
    key = prefix_hashes([1, 2, 3, 4], 4, 1)[0]
    pool.register(block, key)
    assert pool.lookup([key]) == [block]
    pool.share([block])  # a second sequence with the same prefix, while the first still runs
    assert pool.used == 1 and pool.reused == 1
    pool.release([block])
    pool.release([block])
    assert pool.free == 4 and pool.lookup([key]) == [block]  # free, and still holding the prefix
    assert pool.idle_count([block]) == 1
    pool.share([block])  # reusing it takes it out of the free pool
    assert (pool.free, pool.used, pool.reused) == (3, 1, 2)


def test_fresh_blocks_take_empty_ones_first_then_overwrite_the_oldest_cached():
    pool = BlockPool(3)
    pool.reserve(3)
    a, b, c = (pool.allocate() for _ in range(3))
    pool.register(a, 101)
    pool.register(b, 202)
    pool.release([a])
    pool.release([b])
    pool.release([c])  # unregistered: goes back empty
    pool.reserve(2)
    assert pool.allocate() == c  # the empty block first
    assert pool.lookup([101]) == [a] and pool.lookup([202]) == [b]
    assert pool.allocate() == a  # then the least recently freed cached block loses its content
    assert pool.lookup([101]) == [] and pool.lookup([202]) == [b]


def two_cached_blocks(host_blocks: int) -> tuple[BlockPool, int, int]:
    """A pool of two device blocks holding reusable content 101 (freed first) and 202, both free again, and two
    blocks reserved for what comes next."""
    pool = BlockPool(2, host_blocks=host_blocks)
    pool.reserve(2)
    a, b = pool.allocate(), pool.allocate()
    pool.register(a, 101)
    pool.register(b, 202)
    pool.release([a])
    pool.release([b])
    pool.reserve(2)
    return pool, a, b


def test_an_overwritten_reusable_block_goes_to_the_host_tier_and_comes_back_by_onboarding():
    pool, _, b = two_cached_blocks(host_blocks=2)
    pool.allocate()  # overwrites a: its content moves to host RAM
    assert pool.locate([101, 202]) == [None, b] and pool.lookup([101]) == []
    (back,) = pool.onboard([101])  # into b, the one free block, whose content goes to the host in turn
    assert back == b and pool.locate([101, 202]) == [back, None] and pool.host_used == 1
    assert (pool.offloaded, pool.onboarded) == (2, 1)


def test_the_host_tier_keeps_its_newest_blocks_and_without_one_content_is_lost():
    for host_blocks, kept in ((1, [None]), (0, [])):
        pool, _, _ = two_cached_blocks(host_blocks)
        pool.allocate(), pool.allocate()  # a then b overwritten: the host (of one block) keeps b's
        assert pool.locate([202]) == kept and pool.locate([101]) == []


def test_high_priority_blocks_are_overwritten_after_every_default_one():
    pool = BlockPool(3)
    pool.reserve(3)
    blocks = [pool.allocate() for _ in range(3)]
    for block, key in zip(blocks, (1, 2, 3), strict=True):
        pool.register(block, key)
    pool.release(blocks, kept=1)  # the first block holds a kept system prompt
    pool.reserve(2)
    pool.allocate(), pool.allocate()
    assert pool.lookup([1]) == [blocks[0]]  # older than nothing else, yet kept: the default ones went first


def test_a_sequence_frees_its_last_block_first():
    """The end of a prompt is overwritten before its beginning: a prefix with a hole is worth only what precedes it."""
    pool = BlockPool(2)
    pool.reserve(2)
    first, last = pool.allocate(), pool.allocate()
    pool.register(first, 1)
    pool.register(last, 2)
    pool.release([first, last])
    pool.reserve(1)
    assert pool.allocate() == last and pool.lookup([1]) == [first]
