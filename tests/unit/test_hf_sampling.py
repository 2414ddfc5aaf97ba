"""Per-request sampling processors of the hf backend: correct distributions, seeds that belong to the request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from orchestrator.backends.hf import sampling as hs  # noqa: E402


def request(prompt_len: int = 10, generated: int = 0, **kwargs):
    state = SimpleNamespace(logit_processor_kwargs=kwargs, initial_tokens=[0] * prompt_len, generated_tokens=[0] * generated)
    return SimpleNamespace(state=state)


def apply(processor, scores, requests):
    return processor(scores, processor.prepare_tensor_args(requests))


def run_chain(scores, requests):
    for processor in hs.sampling_processors().logits_processor:
        scores = apply(processor, scores, requests)
    return scores


def test_chain_declares_one_argument_row_per_processor():
    chain = hs.sampling_processors()
    assert chain.tensors_required == 7
    assert set(chain.supported_keys) == {"guide_state",
        "temperature", "top_k", "top_p", "min_p", "sample_seed", "top_logprobs", "logit_bias",
        "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens", "end_tokens",
    }


def test_draws_follow_the_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5, 3.0]])
    counts = torch.zeros(4)
    draw = hs.SeededDraw()
    for position in range(20000):
        counts[apply(draw, logits, [request(position, sample_seed=3)]).argmax(-1)] += 1
    assert torch.allclose(counts / 20000, logits.softmax(-1), atol=0.015)


def test_temperature_sharpens_the_distribution():
    logits = torch.tensor([[1.0, 2.0]])
    counts = torch.zeros(2)
    for position in range(4000):
        scores = run_chain(logits.clone(), [request(position, temperature=0.25, sample_seed=1)])
        counts[scores.argmax(-1)] += 1
    expected = (logits / 0.25).softmax(-1)
    assert torch.allclose(counts / 4000, expected, atol=0.02)


def test_same_seed_and_position_give_the_same_token_whatever_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(1, 50000)
    target = request(37, temperature=1.0, sample_seed=2024)
    alone = run_chain(logits.clone(), [target]).argmax(-1).item()
    others = torch.randn(4, 50000)
    batch = torch.cat([others[:2], logits, others[2:]])
    neighbours = [request(5, temperature=0.7, sample_seed=s) for s in range(4)]
    mixed = run_chain(batch, [*neighbours[:2], target, *neighbours[2:]]).argmax(-1)
    assert mixed[2].item() == alone


def test_greedy_rows_are_untouched_next_to_sampled_ones():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    out = run_chain(logits.clone(), [request(), request(temperature=2.0, sample_seed=9)])
    assert torch.equal(out[0], logits[0])


def test_top_k_keeps_only_k_candidates():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    out = apply(hs.TopKFilter(), logits.clone(), [request(top_k=2)])
    assert torch.isfinite(out).tolist() == [[True, True, False, False, False]]


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply(hs.TopPFilter(), probs.log(), [request(top_p=0.75)])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_top_p_wider_than_the_candidates_falls_back_to_a_full_sort():
    logits = torch.zeros(1, 1000)  # flat: the nucleus for 0.9 is 900 tokens, beyond the first 64 candidates
    out = apply(hs.TopPFilter(), logits, [request(top_p=0.9)])
    assert torch.isfinite(out).sum().item() >= 900


def test_neutral_requests_skip_the_work():
    processor = hs.TopPFilter()
    logits = torch.randn(2, 10)
    assert apply(processor, logits, [request(), request()]) is logits


def test_draw_keys_are_31_bit_and_position_dependent():
    keys = {hs.draw_key(7, position) for position in range(1000)}
    assert len(keys) == 1000
    assert all(0 <= k < 2**31 for k in keys)
