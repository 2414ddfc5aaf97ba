"""Which sequences run in the next engine step, as TensorRT-LLM's schedulers decide it.

Admission (the capacity scheduler, GUARANTEED_NO_EVICT): waiting sequences enter the batch best first
(higher priority, then earlier), each reserving KV blocks for its whole prompt and all of its max_new tokens,
less the prompt blocks it finds in the prefix cache on the device; the first one that does not fit waits, and
so does everyone behind it, until running sequences finish and give their blocks back. Nothing running is ever
evicted. Prompt blocks found in the host tier are copied back into fresh blocks at admission (`onboarded`).

The step (the micro-batch scheduler): every decoding sequence contributes one token, then prompts are
prefilled in chunks, in admission order, within `max_num_tokens` tokens per step. A chunk that leaves part
of its prompt for later ends on a block boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.backends.sim.blocks import BlockPool
from orchestrator.backends.sim.sequence import Sequence


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int


def blocks_for(tokens: int, tokens_per_block: int) -> int:
    return -(-tokens // tokens_per_block)


def reusable_blocks(sequence: Sequence, tokens_per_block: int) -> int:
    """Prompt blocks a prefix hit may cover: the last prompt token is always computed, so its block never is."""
    return min(len(sequence.hashes), (len(sequence.prompt) - 1) // tokens_per_block)


def try_admit(sequence: Sequence, pool: BlockPool, limits: BatchLimits) -> bool:
    """Reserve the sequence's blocks (sharing its cached prefix, onboarding what the host tier holds of it) if
    they are free; False leaves it waiting."""
    tpb = limits.tokens_per_block
    hashes = sequence.hashes[: reusable_blocks(sequence, tpb)]
    hit = pool.locate(hashes)
    on_device = [block for block in hit if block is not None]
    fresh = blocks_for(len(sequence.prompt) + sequence.max_new, tpb) - len(on_device)
    if fresh + pool.idle_count(on_device) > pool.available:
        return False
    pool.share(on_device)
    pool.reserve(fresh)
    copied = iter(pool.onboard([key for block, key in zip(hit, hashes, strict=False) if block is None]))
    sequence.blocks = [block if block is not None else next(copied) for block in hit]
    sequence.onboarded = len(hit) - len(on_device)
    sequence.reserve_left = fresh - sequence.onboarded
    sequence.computed = sequence.cached = sequence.length = sequence.capacity = len(hit) * tpb
    sequence.admitted = True
    return True


def admit(waiting: list[Sequence], running: int, pool: BlockPool, limits: BatchLimits) -> list[Sequence]:
    """Take sequences from the head of `waiting` (kept best first) while the batch, now `running` long, has room
    and their blocks are free; returns them, in order."""
    admitted = 0
    while admitted < len(waiting) and running + admitted < limits.max_batch_size:
        if not try_admit(waiting[admitted], pool, limits):
            break
        admitted += 1
    taken = waiting[:admitted]
    del waiting[:admitted]
    return taken


def schedule(decode_rows: int, prefilling: list[Sequence], limits: BatchLimits) -> list[tuple[Sequence, int]]:
    """The next step's prefill chunks, as (sequence, new prompt tokens), after `decode_rows` decode tokens."""
    budget = limits.max_num_tokens - decode_rows
    chunks = []
    for sequence in prefilling:
        if budget <= 0:
            break
        left = len(sequence.prompt) - sequence.computed
        size = min(left, budget)
        if size < left and size >= limits.tokens_per_block:
            size -= size % limits.tokens_per_block
        chunks.append((sequence, size))
        budget -= size
    return chunks
