"""The llamacpp backend's numpy sampling, on logits made up here: every field changes what is chosen."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.backends.llamacpp.sampling import SequenceSampler, draw_key, sample
from orchestrator.engine.request import EngineRequest, SamplingParams

VOCAB = 50
GREEDY = SamplingParams(temperature=0.0)


def sampler(sampling=GREEDY, prompt=(1, 2, 3), ends=(0,), **fields) -> SequenceSampler:
    request = EngineRequest("r", prompt, max_new_tokens=100, sampling=sampling, **fields)
    return SequenceSampler(request, np.array(ends, dtype=np.int64), VOCAB)


def logits(*rows_best: int, rows: int | None = None) -> np.ndarray:
    """Rows with a clear best token each (logit 5) over a gentle slope."""
    out = np.tile(np.linspace(0.0, 1.0, VOCAB, dtype=np.float32), (len(rows_best), 1))
    for i, best in enumerate(rows_best):
        out[i, best] = 5.0
    return out


def test_greedy_takes_the_argmax_of_each_row():
    choices = sample(logits(7, 11), [sampler(), sampler()])
    assert [c.token for c in choices] == [7, 11]


def test_a_plain_greedy_batch_chooses_as_a_batch_that_needs_the_general_path():
    """All rows greedy with nothing to adjust take one argmax over the matrix; the tokens are those each row gets
    beside a row that needs adjusting, ties included (the lower id)."""
    rows = logits(7, 11, 3)
    rows[2, 9] = rows[2, 3]  # a tie: token 3 wins
    plain = sample(rows.copy(), [sampler(), sampler(), sampler()])
    mixed = sample(rows.copy(), [sampler(), sampler(), sampler(logprobs=True)])
    assert [c.token for c in plain] == [c.token for c in mixed] == [7, 11, 3]
    assert all(c.logprob is None and c.error is None for c in plain)


def test_a_plain_greedy_row_with_no_finite_logit_fails_alone():
    rows = logits(7, 11)
    rows[0] = np.nan
    choices = sample(rows, [sampler(), sampler()])
    assert choices[0].error and choices[1].token == 11 and choices[1].error is None


def test_logit_bias_forces_and_forbids_tokens():
    forced = sampler(SamplingParams(temperature=0.0, logit_bias=((20, 100.0),)))
    forbidden = sampler(SamplingParams(temperature=0.0, logit_bias=((7, -100.0),)))
    choices = sample(logits(7, 7), [forced, forbidden])
    assert choices[0].token == 20
    assert choices[1].token == VOCAB - 1  # the slope's best once 7 is pushed down


def test_repetition_penalty_makes_prompt_tokens_less_likely():
    row = logits(7)
    row[0, 3] = 4.9  # a prompt token just below the best
    row[0, 7] = 4.0
    plain, penalised = sample(row.copy(), [sampler()]), sample(row.copy(), [
        sampler(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=(3,))])
    assert plain[0].token == 3 and penalised[0].token == 7


def test_presence_and_frequency_penalties_count_output_tokens():
    s = sampler(SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=1.0))
    row = logits(7)
    s.accept(7)
    s.accept(7)  # twice: 5 - (1 presence + 2 x 1 frequency)
    adjusted = row.copy()
    s.adjust(adjusted[0])
    assert adjusted[0, 7] == pytest.approx(5.0 - 3.0)
    assert adjusted[0, 8] == row[0, 8]  # tokens not generated are untouched
    s.accept(7)
    s.adjust(row[0])
    assert row[0, 7] == pytest.approx(5.0 - 4.0)


def test_end_tokens_are_banned_before_min_tokens_only():
    s = sampler(ends=(7,), min_tokens=2)
    assert sample(logits(7), [s])[0].token != 7
    s.accept(1)
    s.accept(1)
    assert sample(logits(7), [s])[0].token == 7


def test_a_constraint_sees_the_adjusted_row_and_its_mask_wins():
    class OnlyEven:
        accepted: list[int] = []

        def apply(self, row):
            row[1::2] = -np.inf

        def accept(self, token):
            self.accepted.append(token)

    s = sampler(SamplingParams(temperature=0.0, logit_bias=((9, 100.0),)))
    s.constraint = OnlyEven()
    choice = sample(logits(7), [s])[0]
    assert choice.token % 2 == 0
    s.accept(choice.token)
    assert s.constraint.accepted == [choice.token]


def test_a_row_with_no_allowed_token_is_an_error_not_a_token():
    class Nothing:
        def apply(self, row):
            row[:] = -np.inf

        def accept(self, token):
            raise AssertionError("never accepted")

    s = sampler(SamplingParams(temperature=0.7, seed=1))
    s.constraint = Nothing()
    assert sample(logits(7), [s])[0].error


def test_top_k_one_and_a_tiny_top_p_are_greedy():
    row = logits(7, 7)
    row[:, 6] = 4.9  # a close second: plain sampling would take it often
    top_k = sampler(SamplingParams(temperature=1.5, top_k=1, seed=3))
    top_p = sampler(SamplingParams(temperature=1.5, top_p=0.01, seed=3))
    for position in range(20):
        top_k.generated = top_p.generated = position
        assert [c.token for c in sample(row.copy(), [top_k, top_p])] == [7, 7]


def test_a_temperature_too_small_for_float32_is_greedy():
    row = logits(7, 7)
    row[:, 6] = 4.9
    for temperature in (5e-324, 3e-243, 1e-40):  # zero in float32, or a quotient past its range
        tiny = sampler(SamplingParams(temperature=temperature, top_p=0.1, seed=3))
        choice = sample(row.copy(), [tiny, sampler(SamplingParams(temperature=temperature, seed=3))])
        assert [(c.token, c.error) for c in choice] == [(7, None), (7, None)]


def test_min_p_never_draws_a_token_below_its_threshold():
    row = np.full((1, VOCAB), 0.0, dtype=np.float32)
    row[0, :3] = [3.0, 2.9, 2.8]  # the rest is e^-3 ~ 5% of the best each
    s = sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=11))
    drawn = set()
    for position in range(200):
        s.generated = position
        drawn.add(sample(row.copy(), [s])[0].token)
    assert drawn == {0, 1, 2}


def test_the_same_seed_draws_the_same_tokens_whatever_else_the_batch_holds():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(1, VOCAB)).astype(np.float32)
    others = rng.normal(size=(5, VOCAB)).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    alone, batched = [], []
    for position in range(30):
        a, b = sampler(params), sampler(params)
        a.generated = b.generated = position
        alone.append(sample(base.copy(), [a])[0].token)
        batch = np.concatenate([others[:2], base, others[2:]])
        mates = [sampler(SamplingParams(temperature=0.9, seed=s)) for s in range(5)]
        batched.append(sample(batch, [*mates[:2], b, *mates[2:]])[2].token)
    assert alone == batched
    assert len(set(alone)) > 3  # it does sample


def test_draws_follow_the_distribution():
    row = np.log(np.array([[0.5, 0.3, 0.2] + [1e-9] * (VOCAB - 3)], dtype=np.float32))
    s = sampler(SamplingParams(temperature=1.0, seed=5))
    counts = np.zeros(VOCAB)
    for position in range(3000):
        s.generated = position
        counts[sample(row.copy(), [s])[0].token] += 1
    assert counts[:3] / 3000 == pytest.approx([0.5, 0.3, 0.2], abs=0.04)


def test_draw_keys_depend_on_seed_and_position_only():
    assert draw_key(1, 5) == draw_key(1, 5)
    assert len({draw_key(seed, pos) for seed in range(10) for pos in range(10)}) == 100


def test_logprobs_are_the_models_distribution_before_any_truncation():
    """What the model thinks of each token (log-softmax of the row), whatever temperature and top-k/top-p do to
    the draw, with exactly top_logprobs alternatives: a sampled request at the model's default sampling must not
    report one alternative at log probability 0."""
    row = logits(7)
    expected = row[0] - np.log(np.exp(row[0]).sum())
    greedy = sampler(logprobs=True, top_logprobs=3)
    choice = sample(row.copy(), [greedy])[0]
    assert choice.logprob == pytest.approx(float(expected[7]), abs=1e-5)
    assert choice.top[0][0] == 7 and len(choice.top) == 3
    assert [lp for _, lp in choice.top] == sorted((lp for _, lp in choice.top), reverse=True)

    for params in (SamplingParams(temperature=1.0, top_k=2, seed=9), SamplingParams(temperature=0.2, top_p=0.9, seed=9)):
        choice = sample(row.copy(), [sampler(params, logprobs=True, top_logprobs=5)])[0]
        assert len(choice.top) == 5 and choice.top[0][0] == 7
        assert all(lp == pytest.approx(float(expected[t]), abs=1e-5) for t, lp in choice.top)
        assert choice.logprob == pytest.approx(float(expected[choice.token]), abs=1e-5) and choice.logprob < 0


def test_a_row_whose_sampling_raises_fails_alone_and_the_others_are_chosen():
    class Broken:
        def apply(self, row):
            raise RuntimeError("matcher state lost")

        def accept(self, token):
            raise AssertionError("never accepted")

    broken = sampler()
    broken.constraint = Broken()
    sampled = sampler(SamplingParams(temperature=0.7, seed=1))
    choices = sample(logits(7, 11, 13), [sampler(), broken, sampled])
    assert choices[0].token == 7 and choices[0].error is None
    assert choices[1].error == "sampling failed: RuntimeError: matcher state lost"
    assert choices[2].error is None and choices[2].token == sample(logits(13), [sampler(sampled.request.sampling)])[0].token


@pytest.mark.parametrize("best", [(7,), (7, 3)])
def test_a_plain_greedy_row_without_a_finite_logit_fails_that_row_alone(best):
    matrix = logits(*best)
    matrix[0] = np.nan
    choices = sample(matrix, [sampler() for _ in best])
    assert choices[0].error == "no token is allowed at this position"
    assert [c.token for c in choices[1:]] == list(best[1:]) and all(c.error is None for c in choices[1:])
    assert [c.token for c in sample(logits(*best), [sampler() for _ in best])] == list(best)
