"""ASCII prompts tokenised piece by piece (text/pieces.py): the ids are the tokenizer's own for every ASCII text,
cold and warm, for the tokenizer shapes it serves (GPT-2's regex, a Llama 3 style Split pattern, a normaliser
that leaves ASCII as it is); other shapes and other texts are left to the tokenizer; pieces are kept per scope and
within their bounds."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers

from orchestrator.text import pieces, segments
from orchestrator.text.pieces import PieceCache, ascii_regex
from tests.unit.test_segments import LLAMA3_SPLIT, SPECIALS, reshaped, shaped, whole

SERVED = ["embedded", "llama3-split", "normalised"]
_CACHES: dict[str, PieceCache] = {}  # one per shape (each is checked against its tokenizer when made)
_SALTS = itertools.count()


@pytest.fixture(scope="module")
def embedded(default_engine) -> Tokenizer:
    return Tokenizer.from_file(str(default_engine / "tokenizer.json"))


def encoded(cache: PieceCache, text: str, salt: str = "key") -> list[int] | None:
    with segments.scope(salt):
        return cache.encode(text)


ascii_text = st.lists(st.one_of(
    st.sampled_from(SPECIALS),
    st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "'re", "I'm", "123456", "3.14", "<|", "|>", "<|im_",
                     "  x", "\n\n  ", "!!", "--", "\x00", "\x1f", "\x7f", "\x0b\x0c"]),
    st.text(st.characters(max_codepoint=127), max_size=30),
), max_size=40).map("".join)


@pytest.mark.parametrize("shape", SERVED)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ascii_text)
def test_an_ascii_text_has_the_tokenizers_own_ids_cold_and_warm(embedded, shape, text):
    tokenizer = shaped(embedded, shape)
    cache = _CACHES.get(shape) or _CACHES.setdefault(shape, PieceCache(tokenizer))
    assert cache.problem is None
    expected, salt = whole(tokenizer, text), f"key {next(_SALTS)}"  # a new scope: cold
    assert encoded(cache, text, salt) == expected
    assert encoded(cache, text, salt) == expected


@pytest.mark.parametrize("shape", SERVED)
def test_every_pair_of_ascii_characters_has_the_tokenizers_own_ids(embedded, shape):
    tokenizer = shaped(embedded, shape)
    cache = PieceCache(tokenizer)
    rng = random.Random(5)
    chars = [chr(c) for c in range(128)]
    for first in chars:
        text = "".join(first + second + rng.choice(["", " ", "a", "1", "'"]) for second in chars)
        assert encoded(cache, text) == whole(tokenizer, text), repr(first)


def test_an_added_token_that_begins_with_another_is_matched_whole(embedded):
    tokenizer = reshaped(embedded, added=[AddedToken("<|im_start|>user", normalized=False)])
    cache = PieceCache(tokenizer)
    for text in ["<|im_start|>user\nhi<|im_start|>users<|im_start|>use", "x<|im_start|>user<|im_start|>"]:
        assert encoded(cache, text) == whole(tokenizer, text)


@pytest.mark.parametrize("shape", ["added", "metaspace-first"])
def test_a_tokenizer_of_another_shape_is_left_to_itself(embedded, shape):
    cache = PieceCache(shaped(embedded, shape))
    assert cache.problem and encoded(cache, "plain words") is None


def test_a_pattern_with_a_class_it_does_not_know_is_left_to_the_tokenizer(embedded):
    other = shaped(embedded, "embedded").from_str(shaped(embedded, "embedded").to_str())
    other.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{Lu}+|\s+"), "isolated"),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    assert "no ASCII twin" in PieceCache(other).problem
    for pattern in (r"\P{L}+", r"a\z", r"(?<name>a)"):  # an escape or a construct that differs, or is not Python's
        with pytest.raises(ValueError):
            ascii_regex(pattern)
    assert ascii_regex(LLAMA3_SPLIT).pattern.startswith("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\nA-Za-z0-9]?[A-Za-z]+")


def test_other_texts_and_texts_outside_a_scope_are_left_to_the_tokenizer(embedded):
    cache = PieceCache(embedded)
    assert encoded(cache, "café") is None  # not ASCII
    assert encoded(cache, "x" * (pieces.MAX_CHARS + 1)) is None  # long: the tokenizer releases the GIL
    assert cache.encode("plain words") is None  # outside a scope


def test_pieces_are_kept_per_scope_and_within_bounds(embedded, monkeypatch):
    monkeypatch.setattr(pieces, "CAPACITY_PIECES", 10)
    monkeypatch.setattr(pieces, "SCOPES", 2)
    cache = PieceCache(embedded)
    text = " ".join(f"word{n}" for n in range(30))
    for salt in ("a", "b", "a", "c"):
        assert encoded(cache, text, salt) == whole(embedded, text)
    assert list(cache._scopes) == ["a", "c"]  # b was the least recently used
    assert encoded(cache, "word0 word1", "c") == whole(embedded, "word0 word1")
    assert len(cache._scopes["c"]) <= 10 + 2  # past its bound a key's pieces start again
