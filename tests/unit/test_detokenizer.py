"""Incremental detokenisation and stop strings, on the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

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
