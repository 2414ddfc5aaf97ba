"""A model's vocabulary as a grammar engine needs it, read from its engine folder with `tokenizers` only.

These are exactly the inputs of TensorRT-LLM's `GuidedDecodingConfig(encoded_vocab, tokenizer_str,
stop_token_ids)` and of xgrammar's `TokenizerInfo` (which the C++ guided decoder builds from them), so a
grammar compiled over this vocabulary here compiles the same way in the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True)
class Vocabulary:
    """`encoded`: every token's string in id order ("" for an id the tokenizer does not use);
    `tokenizer_json`: the tokenizer's JSON (xgrammar reads the vocabulary type from it);
    `stop_token_ids`: the ids that end a sequence; `size`: the width of the model's logits, which may be
    larger than the tokenizer's vocabulary (padding rows that are never allowed)."""

    encoded: tuple[str, ...]
    tokenizer_json: str
    stop_token_ids: tuple[int, ...]
    size: int


def load_vocabulary(
    folder: Path, *, stop_token_ids: tuple[int, ...] | None = None, size: int | None = None
) -> Vocabulary:
    """The vocabulary of an engine folder (its tokenizer.json).

    Stop ids default to the manifest's `tokenizer.eos_token_ids`, else the tokenizer config's
    `eos_token`. The logits width defaults to config.json's `vocab_size` when it is larger than the
    tokenizer's vocabulary, else the vocabulary's size.
    """
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    by_token = tokenizer.get_vocab(with_added_tokens=True)
    encoded = [""] * (max(by_token.values()) + 1)
    for token, token_id in by_token.items():
        encoded[token_id] = token
    stops = tuple(stop_token_ids) if stop_token_ids else _default_stop_ids(folder, by_token)
    width = max(len(encoded), size or _config_vocab_size(folder))
    return Vocabulary(tuple(encoded), tokenizer.to_str(), stops, width)


def _default_stop_ids(folder: Path, by_token: dict[str, int]) -> tuple[int, ...]:
    manifest = _read_json(folder / "engine.json")
    ids = manifest.get("tokenizer", {}).get("eos_token_ids")
    if ids:
        return tuple(int(i) for i in ids)
    eos = _read_json(folder / "tokenizer_config.json").get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str) and eos in by_token:
        return (by_token[eos],)
    raise ValueError(f"{folder}: no end token found (engine.json tokenizer.eos_token_ids or eos_token)")


def _config_vocab_size(folder: Path) -> int:
    size = _read_json(folder / "config.json").get("vocab_size")
    return int(size) if isinstance(size, int) else 0


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
