"""Which sequences run in the next engine step, as TensorRT-LLM's schedulers decide it.

Admission (the capacity scheduler, GUARANTEED_NO_EVICT): waiting sequences enter the batch best first
(higher priority, then earlier), each reserving KV blocks for its whole prompt and all of its max_new tokens,
less the prompt blocks it finds in the prefix cache; the first one that does not fit waits, and so does
everyone behind it, until running sequences finish and give their blocks back. Nothing is ever evicted.

The step (the micro-batch scheduler): every decoding sequence contributes one token, then prompts are
prefilled in chunks, in admission order, within `max_num_tokens` tokens per step. A chunk that leaves part
of its prompt for later ends on a block boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.sim.blocks import BlockPool
from orchestrator.sim.sequence import Sequence


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
    """Reserve the sequence's blocks (sharing its cached prefix) if they are free; False leaves it waiting."""
    tpb = limits.tokens_per_block
    hit = pool.lookup(sequence.hashes[: reusable_blocks(sequence, tpb)])
    fresh = blocks_for(len(sequence.prompt) + sequence.max_new, tpb) - len(hit)
    if fresh + pool.idle_count(hit) > pool.available:
        return False
    pool.share(hit)
    pool.reserve(fresh)
    sequence.blocks = list(hit)
    sequence.reserve_left = fresh
    sequence.computed = sequence.cached = len(hit) * tpb
    return True


def admit(waiting: list[Sequence], running: list[Sequence], pool: BlockPool, limits: BatchLimits) -> list[Sequence]:
    """Move sequences from the head of `waiting` (kept best first) into `running`; returns those admitted."""
    admitted = 0
    while admitted < len(waiting) and len(running) < limits.max_batch_size:
        sequence = waiting[admitted]
        if not try_admit(sequence, pool, limits):
            break
        running.append(sequence)
        admitted += 1
    taken = waiting[:admitted]
    del waiting[:admitted]
    return taken


def schedule(running: list[Sequence], limits: BatchLimits) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
    """The next step: (the decoding sequences, one token each; the prefill chunks as (sequence, new tokens))."""
    decoding = [sequence for sequence in running if not sequence.prefilling]
    budget = limits.max_num_tokens - len(decoding)
    chunks = []
    for sequence in running:
        if budget <= 0:
            break
        if not sequence.prefilling:
            continue
        left = len(sequence.prompt) - sequence.computed
        size = min(left, budget)
        if size < left and size >= limits.tokens_per_block:
            size -= size % limits.tokens_per_block
        chunks.append((sequence, size))
        budget -= size
    return decoding, chunks
