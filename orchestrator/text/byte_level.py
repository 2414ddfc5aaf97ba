"""Each token's bytes under a byte-level decoder (GPT-2's, used by Llama 3, Qwen, SmolLM2 and most BPE models),
so the worker can detokenise a step without calling into the tokenizer per token.

A `ByteLevel` decoder is context-free: the text of a run of tokens is the UTF-8 decoding (invalid bytes
replaced) of the concatenation of each token's bytes, where a token's bytes are its characters mapped back
through GPT-2's byte↔character table, or the token's own UTF-8 when one of its characters is not in the table
(an added token, for instance). That is how tokenizers' ByteLevel decoder turns tokens into bytes.
"""

from __future__ import annotations

import orjson
from tokenizers import Tokenizer, decoders


def _bytes_to_chars() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, every other byte for a character from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


CHAR_BYTES = {char: byte for byte, char in _bytes_to_chars().items()}


class ByteLevelPieces:
    """Every token's bytes, computed on first use and kept (one table per worker, shared by its requests): one
    table that skips special tokens (they add no bytes) and one that keeps them."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._special = frozenset(i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special)
        self._tables: dict[bool, dict[int, bytes]] = {True: {}, False: {}}
        self.jsons: dict[int, bytes] = {}  # `json`'s answers so far (read directly on the worker's per-token path)

    @staticmethod
    def serves(tokenizer: Tokenizer) -> bool:
        """Whether this tokenizer decodes with a byte-level decoder alone (else its own DecodeStream is used)."""
        return isinstance(tokenizer.decoder, decoders.ByteLevel)

    def join(self, token_ids: list[int], skip_special_tokens: bool) -> bytes:
        """The bytes these tokens add to the text (special tokens add none when skipped)."""
        table = self._tables[skip_special_tokens]
        if len(token_ids) == 1:  # the usual step: one new token
            token_id = token_ids[0]
            piece = table.get(token_id)
            return piece if piece is not None else self._fill(table, token_id, skip_special_tokens)
        return b"".join([piece if (piece := table.get(token_id)) is not None
                         else self._fill(table, token_id, skip_special_tokens) for token_id in token_ids])

    def json(self, token_id: int) -> bytes:
        """The token's text as a JSON string where its bytes are whole characters on their own (special tokens
        skipped), so a stream with nothing held back can write it as it is; b"" where it is not."""
        body = self.jsons.get(token_id)
        if body is None:
            text = self.join([token_id], True).decode("utf-8", "replace")
            body = self.jsons[token_id] = orjson.dumps(text) if text and "\ufffd" not in text else b""
        return body

    def _fill(self, table: dict[int, bytes], token_id: int, skip_special_tokens: bool) -> bytes:
        piece = table[token_id] = b"" if skip_special_tokens and token_id in self._special else self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> bytes:
        token = self._tokenizer.id_to_token(token_id)
        if token is None:  # not in the vocabulary: decoding leaves it out
            return b""
        try:
            return bytes([CHAR_BYTES[char] for char in token])
        except KeyError:
            return token.encode()
