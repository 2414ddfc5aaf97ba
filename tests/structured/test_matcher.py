"""Per-request constrained decoding over the real SmolLM2 vocabulary, driven by synthetic logits."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Literal

import pytest
import torch
import xgrammar as xgr
from pydantic import BaseModel

from orchestrator.structured.grammar.matcher import GrammarCache, GuidedBatchMasker, _apply_with_torch
from orchestrator.structured.guide import Guide, json_schema_guide
from orchestrator.structured.vocabulary import load_vocabulary

from .synthetic import greedy_decode


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    city: str
    floor: int | None


class Person(BaseModel):
    name: str
    age: int
    role: Literal["admin", "user", "guest"]
    color: Color
    tags: list[str]
    address: Address
    scores: list[float]


@pytest.fixture(scope="module")
def cache(smollm2_dir: Path) -> GrammarCache:
    return GrammarCache(load_vocabulary(smollm2_dir))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_decode_follows_a_pydantic_schema_with_nested_objects_enums_and_arrays(smollm2_dir, cache, seed):
    state = cache.new_state(json_schema_guide(Person.model_json_schema(), param="response_format"))
    text, _ = greedy_decode(smollm2_dir, cache, state, seed=seed)
    person = Person.model_validate_json(text)
    assert list(person.model_dump()) == ["name", "age", "role", "color", "tags", "address", "scores"]


def test_json_object_allows_any_object_and_only_objects(smollm2_dir, cache):
    text, _ = greedy_decode(smollm2_dir, cache, cache.new_state(Guide("json_object")), seed=3)
    assert text.lstrip().startswith("{")
    import json

    assert isinstance(json.loads(text), dict)


def test_a_complete_grammar_allows_only_the_end_tokens(cache):
    state = cache.new_state(Guide("regex", "(yes|no)"))
    tokens = cache.vocabulary.encoded
    assert state.advance([tokens.index("yes")])
    logits = torch.zeros(1, cache.vocabulary.size)
    GuidedBatchMasker(cache.vocabulary.size).apply(logits, [(0, state)])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == list(cache.vocabulary.stop_token_ids)
    assert state.accept(cache.vocabulary.stop_token_ids[0]) and state.is_terminated


def test_advance_accepts_only_the_new_tokens_and_stops_at_a_forbidden_one(cache):
    tokens = cache.vocabulary.encoded
    state = cache.new_state(Guide("regex", "[0-9]+"))
    output = [tokens.index("1"), tokens.index("2")]
    assert state.advance(output) and state.accepted == 2
    assert state.advance(output) and state.accepted == 2  # nothing new
    assert not state.advance([*output, tokens.index("a")])
    assert state.accepted == 2


def test_a_terminated_state_masks_its_whole_row(cache):
    state = cache.new_state(Guide("regex", "a"))
    assert state.advance([cache.vocabulary.encoded.index("a"), cache.vocabulary.stop_token_ids[0]])
    logits = torch.zeros(2, cache.vocabulary.size)
    GuidedBatchMasker(cache.vocabulary.size).apply(logits, [(1, state)])
    assert torch.isinf(logits[1]).all() and torch.equal(logits[0], torch.zeros(cache.vocabulary.size))


def test_padding_rows_of_the_logits_are_never_allowed(smollm2_dir):
    """A model whose logits are wider than its tokenizer's vocabulary: the grammar covers the padding
    (vocabulary size given), and logits wider still are masked beyond the grammar's vocabulary."""
    tokenizer_size = len(load_vocabulary(smollm2_dir).encoded)
    padded = load_vocabulary(smollm2_dir, size=tokenizer_size + 64)
    cache = GrammarCache(padded)
    for width in (padded.size, padded.size + 32):
        state = cache.new_state(Guide("json_object"))
        logits = torch.zeros(1, width)
        GuidedBatchMasker(padded.size).apply(logits, [(0, state)])
        assert torch.isinf(logits[0, tokenizer_size:]).all()
        assert torch.isfinite(logits[0, :tokenizer_size]).any()


def test_only_float32_matrices_are_masked(cache):
    state = cache.new_state(Guide("json_object"))
    with pytest.raises(ValueError, match="float32"):
        GuidedBatchMasker(cache.vocabulary.size).apply(
            torch.zeros(1, cache.vocabulary.size).half(), [(0, state)]
        )


def test_the_torch_unpacking_used_off_cpu_masks_exactly_like_xgrammars_kernel(cache):
    state = cache.new_state(json_schema_guide(Person.model_json_schema(), param="p"))
    width = cache.vocabulary.size
    bitmask = xgr.allocate_token_bitmask(2, width)
    state.fill(bitmask, 1)
    logits = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
    expected, actual = logits.clone(), logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask, indices=[1])
    _apply_with_torch(actual, bitmask, [1], width)
    assert torch.equal(expected, actual)
