"""ASCII prompts tokenised piece by piece with each piece's ids kept, in the HTTP process: tokenizers spends ~2 µs
of CPU per token on a chat prompt on a small VM (its pre-tokeniser's regex and allocations, ~300 µs for a
128-token prompt), more than anything else a short request costs the server.

Exact, not approximate: a byte-level BPE tokenizer splits a text at its added tokens, cuts each part between them
into pieces with one regex (GPT-2's, or its own Split pattern: Llama 3's, Qwen's), and runs its model on each piece
alone. For ASCII text that regex has an exact Python twin (`ascii_regex`: letters and digits are the ASCII ones,
whitespace too), so the pieces come from `re`, and each piece's ids from the model once and then from a dict.
Only for tokenizers of that shape (no normaliser that changes ASCII, added tokens that take no whitespace and need
not stand as words), and only where a check at load gives the tokenizer's own ids for texts with every ASCII
character (`problem` says why not). Any other text, or a long one (its Python work would hold the GIL), is
tokenised by the tokenizer itself.

A piece tokenised for one key is reused only for that key (segments.scope), as prompt segments are.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict

from tokenizers import Tokenizer

from orchestrator.text.byte_level import CHAR_BYTES
from orchestrator.text.segments import current_scope

MAX_CHARS = 8192  # longer texts go to the tokenizer, which releases the GIL
CAPACITY_PIECES = 1 << 14  # pieces kept per key; a key's full set is dropped and found again
SCOPES = 32  # keys whose pieces are kept; the least recently used goes first
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_ASCII_CLASSES = {r"\p{L}": "A-Za-z", r"\p{N}": "0-9"}
_ASCII_ESCAPES = set("sSdDwWrntfv")  # mean on ASCII text what they mean to the tokenizer's regex engine
_SAME_ON_ASCII = {None, "NFC", "NFKC", "NFD", "NFKD"}  # normalisers that leave ASCII as it is
_CHECKS = ("".join(map(chr, range(128))), "It's 12345 o'clock,  I'LL\tsay: \"x\"\r\n\n  y  ", " a  b\n \n\t 7e-3 ")


def ascii_regex(pattern: str) -> re.Pattern:
    """The tokenizer's regex (Oniguruma's syntax) as Python's, for ASCII text; ValueError for a Unicode class or an
    escape it does not know, or a construct Python's re does not take."""
    out, in_class, at = [], False, 0
    while at < len(pattern):
        if pattern.startswith(r"\p{", at):
            name = pattern[at : pattern.index("}", at) + 1]
            if name not in _ASCII_CLASSES:
                raise ValueError(f"the class {name} has no ASCII twin here")
            out.append(_ASCII_CLASSES[name] if in_class else f"[{_ASCII_CLASSES[name]}]")
            at += len(name)
            continue
        step = 2 if pattern[at] == "\\" else 1
        if step == 2 and pattern[at + 1 : at + 2].isalnum() and pattern[at + 1] not in _ASCII_ESCAPES:
            raise ValueError(f"the escape \\{pattern[at + 1]} may mean another thing in Python's re")
        in_class = (in_class or pattern[at] == "[") and not (in_class and pattern[at] == "]")
        out.append(pattern[at : at + step])
        at += step
    try:
        return re.compile("".join(out), re.ASCII)
    except re.error as exc:
        raise ValueError(f"Python's re does not take it: {exc}") from None


def _split_pattern(config: dict) -> str:
    """The regex the tokenizer cuts pieces with; ValueError where its shape is not the one served here."""
    pre, model = config.get("pre_tokenizer") or {}, config.get("model") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if model.get("type") != "BPE" or model.get("dropout") or kinds[-1:] != ["ByteLevel"] or \
            steps[-1].get("add_prefix_space") or (config.get("normalizer") or {}).get("type") not in _SAME_ON_ASCII:
        raise ValueError("it is not a byte-level BPE tokenizer that leaves ASCII as it is")
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return GPT2_PATTERN
    split = steps[0] if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True) else {}
    if split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in split.get("pattern", {}):
        raise ValueError("its pre-tokenizer is not one regex and the byte-level map")
    return split["pattern"]["Regex"]


class PieceCache:
    """One tokenizer's pieces of ASCII prompts and their ids, by scope; thread-safe."""

    def __init__(self, tokenizer: Tokenizer):
        self._model = tokenizer.model
        self._chars = str.maketrans({chr(byte): char for char, byte in CHAR_BYTES.items() if byte < 128})
        added = tokenizer.get_added_tokens_decoder()
        self._added = {t.content: i for i, t in added.items()}
        self._scopes: OrderedDict[str, dict[str, tuple[int, ...]]] = OrderedDict()
        self._lock = threading.Lock()
        try:
            if any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
                raise ValueError("an added token takes whitespace with it or must stand as a word")
            self._split = ascii_regex(_split_pattern(json.loads(tokenizer.to_str()))).findall
            spellings = sorted(self._added, key=len, reverse=True)
            self._cut = re.compile("(" + ("|".join(map(re.escape, spellings)) or "(?!)") + ")").split
            self.problem = None
            checks = (*_CHECKS, " x".join(["", *list(self._added)[:16], "\n"]))
            own = [tokenizer.encode(text, add_special_tokens=False).ids for text in checks]
            if wrong := [text for text, ids in zip(checks, own, strict=True) if self._ids(text, {}) != ids]:
                self.problem = f"its own ids differ for {wrong[0][:40]!r}"
        except ValueError as exc:
            self.problem = str(exc)

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text` (no special tokens added); None where this does not apply (outside a scope, a
        tokenizer with a `problem`, a text not ASCII or too long)."""
        salt = current_scope()
        if salt is None or self.problem or len(text) > MAX_CHARS or not text.isascii():
            return None
        with self._lock:
            pieces = self._scopes.get(salt)
            if pieces is None or len(pieces) > CAPACITY_PIECES:
                pieces = self._scopes[salt] = {}
                if len(self._scopes) > SCOPES:
                    self._scopes.popitem(last=False)
            self._scopes.move_to_end(salt)
        return self._ids(text, pieces)

    def _ids(self, text: str, pieces: dict[str, tuple[int, ...]]) -> list[int]:
        ids: list[int] = []
        for index, part in enumerate(self._cut(text)):
            if index % 2:  # an added token
                ids.append(self._added[part])
                continue
            for piece in self._split(part):
                found = pieces.get(piece)
                if found is None:
                    found = pieces[piece] = tuple(t.id for t in self._model.tokenize(piece.translate(self._chars)))
                ids += found
        return ids
