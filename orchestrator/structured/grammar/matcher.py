"""Constrained decoding inside a worker, for backends that sample in Python (hf, llamacpp): compiled
grammars per model, one grammar state per request, and one call that masks a batch's constrained rows.

Per step, for every constrained row: accept the token the request just produced (`GuidedState.advance`),
then `GuidedBatchMasker.apply(logits, rows)` fills each row's bitmask and sets every token the grammar
forbids to -inf, before temperature, top-k, top-p and the draw. When the grammar is complete only the end
tokens are allowed, so a constrained request ends with an end token. Unconstrained rows are untouched.

Imports xgrammar (and torch): worker processes only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import xgrammar as xgr

from orchestrator.structured.grammar.compile import GrammarRefused, compile_guide, new_compiler
from orchestrator.structured.guide import Guide
from orchestrator.structured.vocabulary import Vocabulary

DEFAULT_CACHE_LIMIT_BYTES = 512 * 1024 * 1024


class GrammarCache:
    """Compiled grammars over one model's vocabulary (xgrammar's compiler cache, bounded in bytes)."""

    def __init__(
        self, vocabulary: Vocabulary, *, threads: int = 2, cache_limit_bytes: int = DEFAULT_CACHE_LIMIT_BYTES
    ):
        self.vocabulary = vocabulary
        self._compiler = new_compiler(vocabulary, threads=threads, cache_limit_bytes=cache_limit_bytes)

    def compile(self, guide: Guide) -> xgr.CompiledGrammar:
        """The compiled grammar (from the cache when seen before); GrammarRefused if it does not compile,
        which cannot happen for a guide the checker admitted over the same vocabulary."""
        kind, text = guide.compiled_form()
        return compile_guide(self._compiler, kind, text)

    def new_state(self, guide: Guide) -> GuidedState:
        return GuidedState(self.compile(guide))


class GuidedState:
    """One request's position in its grammar. `advance` accepts the tokens generated since the last call,
    so a backend can hand it the request's whole output each step."""

    def __init__(self, compiled: xgr.CompiledGrammar):
        self._matcher = xgr.GrammarMatcher(compiled)
        self.accepted = 0  # tokens of the output accepted so far

    def accept(self, token_id: int) -> bool:
        """Accept one token; False if the grammar forbids it (the state is then unchanged)."""
        ok = self._matcher.accept_token(int(token_id))
        self.accepted += int(ok)
        return ok

    def advance(self, generated: Sequence[int]) -> bool:
        """Accept `generated[self.accepted:]`; False at the first token the grammar forbids."""
        return all(self.accept(token) for token in generated[self.accepted :])

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into `bitmask[row]`; False when every token is allowed."""
        return self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        """True once an end token was accepted: the output is complete."""
        return self._matcher.is_terminated()


class RowConstraint:
    """One request's grammar over one numpy row of logits at a time (llamacpp_sampling's TokenConstraint):
    `apply` sets every token the grammar forbids now to -inf in place, `accept` advances it by the chosen token.
    Tokens beyond the grammar's vocabulary (padding) are always forbidden; once the output is complete nothing
    is allowed (its end token has ended the request)."""

    def __init__(self, state: GuidedState, vocab_size: int):
        self.state = state
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def apply(self, row: np.ndarray) -> None:
        width = min(row.shape[0], self.vocab_size)
        row[width:] = -np.inf
        if self.state.is_terminated:
            row[:width] = -np.inf
        elif self.state.fill(self._bitmask, 0):
            xgr.apply_token_bitmask_inplace(torch.from_numpy(row[:width]).unsqueeze(0), self._bitmask, vocab_size=width)

    def accept(self, token: int) -> None:
        self.state.accept(token)


class GuidedBatchMasker:
    """Applies the constrained rows' grammars to a batch of logits, reusing one bitmask buffer."""

    def __init__(self, vocab_size: int, rows: int = 1):
        self.vocab_size = vocab_size  # the grammar's vocabulary (TokenizerInfo's vocab_size)
        self._bitmask = xgr.allocate_token_bitmask(rows, vocab_size)

    def apply(self, logits: torch.Tensor, rows: Sequence[tuple[int, GuidedState]]) -> None:
        """Mask, in place, the tokens each `(row, state)` forbids in `logits[row]` (a float32 tensor of shape
        rows x vocabulary). Logits wider than the grammar's vocabulary (padding) are masked beyond it.
        A state whose output is complete allows nothing: its request should already have ended."""
        if not rows:
            return
        if logits.dtype != torch.float32 or logits.dim() != 2:
            raise ValueError(
                f"logits must be a 2-D float32 tensor (got {logits.dtype}, {tuple(logits.shape)})"
            )
        if self._bitmask.size(0) < logits.size(0):
            self._bitmask = xgr.allocate_token_bitmask(logits.size(0), self.vocab_size)
        masked = []
        for row, state in rows:
            if state.is_terminated:
                self._bitmask[row].zero_()
                masked.append(row)
            elif state.fill(self._bitmask, row):
                masked.append(row)
        if masked:
            width = min(logits.size(1), self.vocab_size)
            if logits.device.type == "cpu":
                xgr.apply_token_bitmask_inplace(logits, self._bitmask, vocab_size=width, indices=masked)
            else:  # a pure-torch unpacking: xgrammar's GPU kernel needs triton, which workers need not have
                _apply_with_torch(logits, self._bitmask.to(logits.device), masked, width)
        if logits.size(1) > self.vocab_size:
            logits[[row for row, _ in rows], self.vocab_size :] = float("-inf")


_BIT_POSITIONS = torch.arange(32, dtype=torch.int32)


def _apply_with_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], width: int) -> None:
    index = torch.tensor(rows, device=logits.device)
    words = bitmask.index_select(0, index)
    bits = (words.unsqueeze(-1) >> _BIT_POSITIONS.to(logits.device)) & 1
    allowed = bits.reshape(len(rows), -1)[:, :width].bool()
    view = logits[index, :width]
    logits[index, :width] = view.masked_fill(~allowed, float("-inf"))


__all__ = ["GrammarCache", "GrammarRefused", "GuidedBatchMasker", "GuidedState", "RowConstraint"]
