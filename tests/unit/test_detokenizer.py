"""Incremental detokenisation and stop strings, on the real SmolLM2 tokenizer."""

from __future__ import annotations

import random

import orjson
import pytest
from tokenizers import Tokenizer

from orchestrator.text.byte_level import ByteLevelPieces
from orchestrator.text.detokenizer import IncrementalDetokenizer, StopMatcher


@pytest.fixture(scope="module")
def tokenizer(default_engine) -> Tokenizer:
    return Tokenizer.from_file(str(default_engine / "tokenizer.json"))


@pytest.mark.parametrize("text", ["Café 🎉 naïve 日本語 done", "plain ascii text", "emoji 👩‍👩‍👧 family"])
def test_token_by_token_text_equals_the_whole(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.push([i]) for i in ids) == text


def test_a_character_split_across_tokens_comes_out_whole_once(tokenizer):
    ids = tokenizer.encode(" 🎉", add_special_tokens=False).ids
    assert len(ids) > 1  # the emoji's bytes span several byte-level tokens
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push([i]) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1)  # nothing until the character is complete
    assert pieces[-1] == " 🎉"


def test_batches_of_tokens_per_step(tokenizer):
    text = "Die Straße führt nach Zürich 🚗, oder?"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    chunks = [ids[i : i + 3] for i in range(0, len(ids), 3)]
    assert "".join(detok.push(chunk) for chunk in chunks) == text


def test_special_tokens_are_not_text(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    eos = tokenizer.token_to_id("<|im_end|>")
    assert detok.push([*tokenizer.encode("Hi", add_special_tokens=False).ids, eos]) == "Hi"


def feed(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out, stopped = "", False
    for piece in pieces:
        text, stopped = matcher.push(piece)
        out += text
        if stopped:
            return out, True
    return out + matcher.flush(), stopped


def test_stop_string_inside_one_piece():
    assert feed(StopMatcher(("STOP",)), ["hello STOP world"]) == ("hello ", True)


def test_stop_string_split_across_pieces():
    assert feed(StopMatcher(("STOP",)), ["hello ST", "O", "P world"]) == ("hello ", True)


def test_partial_match_is_held_back_then_released():
    matcher = StopMatcher(("STOP",))
    assert matcher.push("hello ST") == ("hello ", False)  # "ST" could begin the stop string
    assert matcher.push("ART") == ("START", False)
    assert matcher.flush() == ""


def test_held_text_is_released_at_the_end():
    assert feed(StopMatcher(("STOP",)), ["the end S"]) == ("the end S", False)


def test_earliest_of_several_stop_strings_wins():
    assert feed(StopMatcher(("world", "lo w")), ["hello world"]) == ("hel", True)


def test_no_stop_strings_passes_everything_through():
    matcher = StopMatcher(())
    assert matcher.push("anything") == ("anything", False)


def test_only_the_needed_suffix_is_held():
    matcher = StopMatcher(("abcdef",))
    assert matcher.push("xxabc") == ("xx", False)
    assert matcher.push("dxx") == ("abcdxx", False)


# -- the byte-level table gives DecodeStream's text, step for step --------------------------------------------------
SAMPLES = [
    "Café 🎉 naïve 日本語 done", "emoji 👩‍👩‍👧 family, Zürich 🚗", "  leading spaces\n\ttabs and\r\nnewlines  ",
    "def f(x):\n    return {'a': [1, 2.5e-3]}  # code", "Ελληνικά, русский, العربية, עברית, हिन्दी, 한국어",
]


def steps_of(ids: list[int], rng) -> list[list[int]]:
    """The ids cut into steps of one to four tokens, as an engine might deliver them."""
    steps, at = [], 0
    while at < len(ids):
        size = rng.randint(1, 4)
        steps.append(ids[at : at + size])
        at += size
    return steps


def both_ways(tokenizer, steps: list[list[int]], skip_special_tokens: bool) -> tuple[list[str], list[str]]:
    reference = IncrementalDetokenizer(tokenizer, skip_special_tokens)
    table = IncrementalDetokenizer(tokenizer, skip_special_tokens, pieces=ByteLevelPieces(tokenizer))
    return [reference.push(step) for step in steps], [table.push(step) for step in steps]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_byte_level_table_gives_decode_streams_text_step_for_step(tokenizer, skip_special_tokens):
    assert ByteLevelPieces.serves(tokenizer)
    rng = random.Random(7)
    specials = [tokenizer.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")]
    for text in SAMPLES:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        for _ in range(20):
            mixed = list(ids)
            for special in specials:
                mixed.insert(rng.randrange(len(mixed) + 1), special)
            reference, table = both_ways(tokenizer, steps_of(mixed, rng), skip_special_tokens)
            assert table == reference


def test_the_byte_level_table_matches_on_random_tokens_and_broken_characters(tokenizer):
    """Any ids at all, so lone continuation bytes and cut characters (invalid UTF-8) come up too."""
    rng = random.Random(11)
    vocab = tokenizer.get_vocab_size()
    byte_tokens = [tokenizer.token_to_id(char) for char in ("Ã", "©", "ð", "Ł", "¤", "Ģ", "ĸ")]
    for _ in range(300):
        ids = [rng.choice(byte_tokens) if rng.random() < 0.4 else rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        reference, table = both_ways(tokenizer, steps_of(ids, rng), skip_special_tokens=True)
        assert table == reference, ids


def test_a_tokens_json_is_its_text_encoded_where_its_bytes_are_whole_characters(tokenizer):
    """Every token of the vocabulary: its JSON string is the text the table's detokeniser gives for it alone, as
    orjson writes it, where that text is whole characters; b"" where it is not (a cut character, a special token)."""
    pieces = ByteLevelPieces(tokenizer)
    whole = 0
    for token in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        text = IncrementalDetokenizer(tokenizer, pieces=pieces).push([token])
        body = pieces.json(token)
        if body:
            whole += 1
            assert body == orjson.dumps(text) and "\ufffd" not in text, token
        else:
            assert text == "" or "\ufffd" in text, token
    assert whole > tokenizer.get_vocab_size() * 0.9  # the usual token is whole characters
