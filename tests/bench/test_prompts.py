"""Prompts of exactly ISL tokens, counted independently with the embedded default's own tokenizer."""

from __future__ import annotations

import random

import pytest

from orchestrator.bench.prompts import WORDS, PromptMaker, prompts_for
from orchestrator.bench.workload import RequestSpec
from orchestrator.text.prompt import PromptEncoder


@pytest.mark.parametrize("isl", [2, 17, 128, 700])
def test_completion_prompts_have_exactly_isl_tokens(default_engine, isl):
    maker = PromptMaker(default_engine, chat=False)
    encoder = PromptEncoder(default_engine)
    assert maker.exact and "exact" in maker.method
    for seed in range(3):
        text = maker.make(isl, random.Random(seed))
        assert len(encoder.tokenizer.encode(text, add_special_tokens=True).ids) == isl


@pytest.mark.parametrize("isl", [40, 300])
def test_chat_prompts_count_the_template(default_engine, isl):
    maker = PromptMaker(default_engine, chat=True)
    encoder = PromptEncoder(default_engine)
    text = maker.make(isl, random.Random(1))
    assert len(encoder.encode_chat([{"role": "user", "content": text}])) == isl


def test_a_length_below_the_template_is_refused(default_engine):
    maker = PromptMaker(default_engine, chat=True)
    with pytest.raises(ValueError, match="below the"):
        maker.make(3, random.Random(0))


def test_prompts_differ_from_the_first_word_and_are_seeded(default_engine):
    maker = PromptMaker(default_engine, chat=False)
    specs = [RequestSpec(i, "m", 64, 8) for i in range(20)]
    prompts = prompts_for(specs, {"m": maker}, seed=5)
    assert prompts == prompts_for(specs, {"m": maker}, seed=5)
    assert len({p.split()[0] + p.split()[1] for p in prompts}) == 20


def test_without_a_tokenizer_one_word_per_token_and_it_says_so():
    maker = PromptMaker(None, chat=False)
    text = maker.make(50, random.Random(0))
    assert not maker.exact and "approximate" in maker.method
    assert len(text.split()) == 50 and set(text.split()) <= set(WORDS)
