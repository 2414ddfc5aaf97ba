"""The llamacpp backend's sequence slots and the KV cells they hold.

Each llama.cpp sequence id is a `Slot`. A slot in use belongs to one running request; a free slot keeps the cells
of the last request that used it, as a cached prefix for the next one (llamacpp/cache.py decides who reuses
what). Every cell belongs to exactly one slot, so the cells in use are the sum of the slots' token counts.

Two layouts (llamacpp.kv_layout picks one). With a stream per slot, each slot has room for a whole sequence
of its own: nothing competes for cells, and a cached prefix costs no one anything. With one unified pool, the
slots draw on the same cells: cached prefixes are the memory given back first, least recently used first,
when a step needs room, and a request waits for room before it is admitted.
"""

from __future__ import annotations

from orchestrator.backends.llamacpp.api import Context
from orchestrator.backends.llamacpp.cache import Slot


class SlotTable:
    def __init__(self, context: Context):
        self._ctx = context
        self.n_ctx = context.n_ctx
        self.unified = context.unified
        self.seq_cells = context.n_ctx if context.unified else context.n_ctx_seq  # the most one sequence holds
        self.slots = [Slot(seq) for seq in range(context.n_seq_max)]

    def free(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.owner is None]

    def cells_free(self) -> int:
        return self.n_ctx - sum(len(slot.tokens) for slot in self.slots)

    def cells_idle(self) -> int:
        """Cells held by cached prefixes (free slots): reclaimable."""
        return sum(len(slot.tokens) for slot in self.slots if slot.owner is None)

    def cells_running(self) -> int:
        return sum(len(slot.tokens) for slot in self.slots if slot.owner is not None)

    def can_admit(self, needed: int, running: bool) -> bool:
        """Whether a sequence of `needed` cells (at most `seq_cells`) may start now. In a unified pool, while
        others run, it waits until their cells and the cached prefixes leave it room; a slot's own stream
        always has room."""
        return not self.unified or not running or needed <= self.cells_free() + self.cells_idle()

    def truncate(self, slot: Slot, keep: int) -> None:
        """Keep the slot's first `keep` tokens and their cells."""
        self._ctx.seq_truncate(slot.seq, keep)
        del slot.tokens[keep:]

    def make_room(self, cells: int, keep: Slot | None = None) -> bool:
        """Drop cached prefixes, least recently used first (never `keep`'s), until `cells` cells are free. With
        a stream per slot there is nothing to make: each sequence's room is its own."""
        if not self.unified or self.cells_free() >= cells:
            return True
        idle = sorted((s for s in self.slots if s.owner is None and s.tokens and s is not keep),
                      key=lambda s: s.last_used)
        while self.cells_free() < cells and idle:
            self.truncate(idle.pop(0), 0)
        return self.cells_free() >= cells

    def drop_idle(self) -> bool:
        """Drop every cached prefix; False if there was none."""
        idle = [s for s in self.slots if s.owner is None and s.tokens]
        for slot in idle:
            self.truncate(slot, 0)
        return bool(idle)
