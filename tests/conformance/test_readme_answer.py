"""The one test that asserts a model's words: the README's example question, asked of the embedded default (the
llamacpp engine `make serve` builds), is answered right. A newcomer's first answer must not be nonsense on any
CPU. Greedy must name Paris; at the model's default sampling (temperature and top_p from its manifest), at least
6 of 8 seeded answers must (the tolerance: docs/llamacpp.md has the rates measured on the CPUs we know)."""

from __future__ import annotations

import pytest

from tests.conftest import DEFAULT_MODEL, ROOT

pytestmark = pytest.mark.e2e

QUESTION = "Name the capital of France."
README_QUESTION = [{"role": "user", "content": QUESTION}]
TRIES, AT_LEAST = 8, 6


@pytest.fixture
def embedded_default(backend: str) -> None:
    if backend != "llamacpp":
        pytest.skip("the README's answer is the embedded default's, a llamacpp engine")


def test_the_question_is_the_readmes():
    assert QUESTION in (ROOT / "README.md").read_text()


def test_the_readme_question_is_answered_greedy(client, embedded_default):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=README_QUESTION, temperature=0,
                                           max_tokens=64)
    assert "Paris" in reply.choices[0].message.content, reply.choices[0].message.content


def test_the_readme_question_is_answered_at_the_default_sampling(client, embedded_default):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=README_QUESTION, n=TRIES, seed=0,
                                           max_tokens=64)
    answers = [choice.message.content for choice in reply.choices]
    assert sum("Paris" in answer for answer in answers) >= AT_LEAST, answers
