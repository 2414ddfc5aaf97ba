"""Prompt segments tokenised once and reused, in the HTTP process: every turn of an agent's conversation sends the
system prompt, the tools and the turns so far again, and tokenising them costs ~2 µs of CPU per token each time
(~40 ms for a 20k-token prompt on a small VM, all of it before the request reaches the scheduler).

Exact, not approximate: the tokenizer first splits a text at its added tokens and then tokenises each piece
between them on its own (normaliser, pre-tokeniser and model see one piece at a time). So a rendered prompt cut
where it spells special tokens gives, part by part, the same ids as whole. A long prompt is cut into segments
(from one cut to the first cut at least MIN_SEGMENT_CHARS further: a system prompt, the tools, a message or a few
short ones), each looked up here, and only the new ones tokenised; where the cuts fall depends only on the text
before them, so the next turn cuts its old part the same way. Cuts are made only where the tokenizer itself would
split (its non-normalised added tokens, longest first, as it matches them) and only at special tokens that take
no whitespace with them. A tokenizer whose pieces are not independent (an added token that must stand as a word
looks at its neighbours; a pre-tokeniser not known here) gets no cache: `problem` says why, and every prompt is
tokenised whole.

A segment tokenised for one key is reused only for that key, as the prefix cache is (api/cache_salt.py): how fast
a prompt is tokenised must not tell one key what another sent. Preparation names the key's scope (`scope`); a
prompt tokenised outside one is never cached.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tokenizers import Tokenizer

MIN_PROMPT_CHARS = 2048  # a shorter prompt is tokenised whole (under ~1.5 ms): a lookup would not pay
MIN_SEGMENT_CHARS = 512  # a segment holds the pieces up to the first cut after this many characters
CAPACITY_TOKENS = 2_000_000  # ids kept, 4 bytes each beside their text; the least recently used go first
# Pre-tokenisers known to split each piece by its own content: Metaspace's "first" also looks at whether a piece
# starts the text, which a segment's first piece does only in the first segment (every later one starts at a cut).
INDEPENDENT = {"Sequence", "ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit",
               "BertPreTokenizer", "CharDelimiterSplit", "UnicodeScripts", "Metaspace", "FixedLength"}
_SCOPE: ContextVar[str | None] = ContextVar("segment_scope", default=None)


@contextmanager
def scope(salt: str) -> Iterator[None]:
    """Prompts tokenised inside this block may reuse, and leave, segments for requests of the same `salt`."""
    token = _SCOPE.set(salt)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_scope() -> str | None:
    """The salt of the `scope` this runs in; None outside one."""
    return _SCOPE.get()


def _problem(tokenizer: Tokenizer, added: list, cut: set[str]) -> str | None:
    """Why this tokenizer's pieces may not be tokenised apart (`added`: its non-normalised added tokens, `cut`:
    those cut at); None when they may."""
    state = tokenizer.pre_tokenizer.__getstate__().decode() if tokenizer.pre_tokenizer is not None else ""
    if others := set(re.findall(r'"type":"(\w+)"', state)) - INDEPENDENT:
        return f"its pre-tokenizer ({', '.join(sorted(others))}) looks beyond one piece"
    if any(t.single_word for t in added):
        return "an added token must stand as a word, which looks at its neighbours"
    return None if cut else "it has no special token to cut at"


class SegmentCache:
    """One tokenizer's segments of prompts, by scope and text; thread-safe (prompts are tokenised on threads too)."""

    def __init__(self, tokenizer: Tokenizer):
        added = [t for t in tokenizer.get_added_tokens_decoder().values() if not t.normalized]
        self._cut = {t.content for t in added if t.special and not (t.lstrip or t.rstrip)}
        self.problem = _problem(tokenizer, added, self._cut)
        spellings = sorted({t.content for t in added}, key=len, reverse=True)  # longest first, as it matches
        self._pattern = re.compile("|".join(map(re.escape, spellings)) or "(?!)")  # (?!): no added tokens
        self._entries: OrderedDict[tuple[str, str], array] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hit_tokens = self.miss_tokens = 0  # tokens of the segments found, and of those tokenised and kept

    def encode(self, text: str, encode) -> list[int] | None:
        """The ids of `text` (no special tokens added), its segments from the cache and the rest by `encode`
        (a text's ids); None where the cache does not apply (outside a scope, a short prompt, a tokenizer with a
        `problem`)."""
        salt = _SCOPE.get()
        if salt is None or self.problem or len(text) < MIN_PROMPT_CHARS:
            return None
        ids: list[int] = []
        for start, end, kept in self._slices(text):
            part = text[start:end]
            found = self._lookup((salt, part)) if kept else None  # an array: `ids +=` takes it as it is
            if found is None:
                found = encode(part)
                if kept:
                    self._keep((salt, part), found)
            ids += found
        return ids

    def _slices(self, text: str) -> list[tuple[int, int, bool]]:
        """`text` as consecutive (start, end, kept) slices, each from one cut to a later one: as soon as one is
        MIN_SEGMENT_CHARS long it is a segment, kept; what is left after the last is the tail. Where the cuts fall
        depends only on the text before them, so the next turn of a conversation cuts its old part the same."""
        slices, start = [], 0
        for match in self._pattern.finditer(text):
            if match.group() in self._cut and match.start() - start >= MIN_SEGMENT_CHARS:
                slices.append((start, match.start(), True))
                start = match.start()
        return [*slices, (start, len(text), False)] if start < len(text) else slices

    def _lookup(self, key: tuple[str, str]) -> array | None:
        with self._lock:
            if (ids := self._entries.get(key)) is not None:
                self._entries.move_to_end(key)
                self.hit_tokens += len(ids)
        return ids

    def _keep(self, key: tuple[str, str], ids: list[int]) -> None:
        with self._lock:
            if key in self._entries or len(ids) > CAPACITY_TOKENS // 4:
                return
            self._entries[key] = array("i", ids)
            self._tokens += len(ids)
            self.miss_tokens += len(ids)
            while self._tokens > CAPACITY_TOKENS:
                self._tokens -= len(self._entries.popitem(last=False)[1])
