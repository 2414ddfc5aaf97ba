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
