"""Special-token text written inside a conversation stays text: a user's literal `<|im_start|>` is the characters
`<`, `|`, `im`... to the model, never the control token that opens a turn (so no one can fake a system turn).

The chat template writes the control tokens around each message; the tokenizer, given the rendered text, would
read the same spelling inside a message as the control token too. So before rendering, every string of the
messages and tools that spells a special token has that spelling swapped for a marker no client can forge (it
carries a fresh random nonce); the rendered text is then encoded piece by piece: the template's pieces as usual,
and each marker as the special token's spelling encoded as plain text. A conversation that spells no special
token (nearly all) takes none of this and is encoded exactly as before. A model's `special_tokens_in_content`
setting restores the old reading (scheduler/settings.py).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from functools import cached_property

from tokenizers import Tokenizer


@dataclass(frozen=True)
class Marked:
    """Messages and tools whose special-token spellings are markers, and how to read the markers back."""

    messages: list[dict]
    tools: list[dict] | None
    pattern: re.Pattern  # a marker in the rendered text; its group 1 is the index into `spellings`
    spellings: list[str]


class LiteralSpecials:
    """The special tokens of one tokenizer, and a copy of it that reads their spellings as plain text."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        spellings = sorted({t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special},
                           key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, spellings))) if spellings else None

    @cached_property
    def _plain(self) -> Tokenizer:
        plain = Tokenizer.from_str(self._tokenizer.to_str())
        plain.encode_special_tokens = True
        return plain

    def mark(self, messages: list[dict], tools: list[dict] | None) -> Marked | None:
        """The conversation with its special-token spellings as markers; None when it spells none."""
        if self._pattern is None:
            return None
        nonce = secrets.token_hex(8)
        spellings: list[str] = []

        def swap(match: re.Match) -> str:
            spellings.append(match.group(0))
            return f"\ue000{nonce}:{len(spellings) - 1}\ue001"

        marked_messages, marked_tools = self._walk(messages, swap), self._walk(tools, swap)
        if not spellings:
            return None
        return Marked(marked_messages, marked_tools, re.compile(f"\ue000{nonce}:(\\d+)\ue001"), spellings)

    def _walk(self, value, swap):
        """`value` with every string's special-token spellings replaced by `swap`'s markers. (A method, not a
        function nested in `mark`: one that calls itself is a reference cycle, left to the cyclic collector.)"""
        if isinstance(value, str):
            return self._pattern.sub(swap, value)
        if isinstance(value, dict):
            return {key: self._walk(item, swap) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(item, swap) for item in value]
        return value

    def encode(self, text: str, marked: Marked, encode_text, add_special_tokens: bool) -> list[int]:
        """The ids of rendered `text`: its template pieces by `encode_text`, each marker as plain text."""
        ids: list[int] = []
        at = 0
        for match in marked.pattern.finditer(text):
            if match.start() > at:
                ids += encode_text(text[at : match.start()], add_special_tokens and not ids)
            literal = marked.spellings[int(match.group(1))]
            ids += self._plain.encode(literal, add_special_tokens=False).ids
            at = match.end()
        if at < len(text):
            ids += encode_text(text[at:], add_special_tokens and not ids)
        return ids
