"""The sampler on small logit lists with exact expected outputs, and a seeded frequency check."""

import pytest
import torch

from ember.errors import OptionsError
from ember.sample import Sampler, SamplingParams, candidates

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.0, -1.0])


def test_temperature_zero_is_argmax():
    assert Sampler(SamplingParams(temperature=0)).sample(LOGITS) == 1


def test_top_k_keeps_the_k_best_in_order():
    ids, probs = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    assert ids.tolist() == [1, 2]
    expected = torch.softmax(torch.tensor([3.0, 2.0]), 0)
    assert torch.allclose(probs, expected)


def test_top_p_keeps_smallest_prefix_past_p():
    # softmax of [3, 2, 1, 0, -1] = [.636, .234, .086, .032, .012]
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=0.8))
    assert ids.tolist() == [1, 2]
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=0.5))
    assert ids.tolist() == [1]


def test_min_p_drops_tokens_below_fraction_of_best():
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1))
    assert ids.tolist() == [1, 2, 0]


def test_seed_repeats_the_same_draws():
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=42)
    a = [Sampler(params).sample(LOGITS) for _ in range(1)]
    draws = [Sampler(params) for _ in range(2)]
    seq = [[s.sample(LOGITS) for _ in range(50)] for s in draws]
    assert seq[0] == seq[1] and a[0] == seq[0][0]


def test_draws_follow_the_distribution():
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=7))
    n = 20_000
    counts = torch.bincount(torch.tensor([sampler.sample(LOGITS) for _ in range(n)]), minlength=5)
    expected = torch.softmax(LOGITS, 0) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001


@pytest.mark.parametrize(
    "bad", [{"temperature": -1}, {"top_k": -1}, {"top_p": 1.5}, {"min_p": -0.1}]
)
def test_impossible_values_are_rejected(bad):
    with pytest.raises(OptionsError):
        SamplingParams(**bad)
