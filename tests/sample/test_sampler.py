"""The sampler on small logit lists with exact expected outputs, and a seeded frequency check."""

import math

import pytest
import torch

from ember.errors import OptionsError
from ember.sample import SamplingParams
from ember.sample.sampler import Sampler, candidates, logprobs, penalize, typical

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.0, -1.0])


def test_temperature_zero_is_argmax():
    assert Sampler(SamplingParams(temperature=0)).sample(LOGITS) == 1


def test_top_k_keeps_the_k_best_in_order():
    ids, probs = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    assert ids.tolist() == [1, 2]
    expected = torch.softmax(torch.tensor([3.0, 2.0]), 0)
    assert torch.allclose(probs, expected)


def test_top_k_ties_go_to_the_lowest_ids():
    logits = torch.tensor([1.0, 2.0, 0.0, 2.0, 2.0])
    ids, _ = candidates(logits, SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    assert ids.tolist() == [1, 3]
    ids, _ = candidates(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
    assert ids.tolist() == [1, 3, 4, 0, 2]


def test_temperature_divides_the_logits_before_softmax():
    # ln 2 and 0 at temperature 0.5 are 2 ln 2 and 0: probabilities 4/5 and 1/5
    logits = torch.tensor([0.0, math.log(2.0)])
    for temperature, expected in [(0.5, [0.8, 0.2]), (1.0, [2 / 3, 1 / 3]), (2.0, None)]:
        params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0)
        ids, probs = candidates(logits, params)
        assert ids.tolist() == [1, 0]
        if expected is None:  # sqrt 2 : 1
            expected = [math.sqrt(2) / (1 + math.sqrt(2)), 1 / (1 + math.sqrt(2))]
        assert probs.tolist() == pytest.approx(expected, abs=1e-6)


def test_softmax_subtracts_the_max_so_large_logits_stay_finite():
    logits = torch.tensor([1000.0, 999.0, -1000.0])  # exp(1000) overflows float32
    _, probs = candidates(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
    e = 1 / (1 + math.exp(-1))
    assert probs.tolist() == pytest.approx([e, 1 - e, 0.0], abs=1e-6)


def test_nan_logits_are_an_error_not_a_token():
    with pytest.raises(ValueError, match="NaN"):
        Sampler(SamplingParams(seed=0)).sample(torch.tensor([1.0, float("nan"), 0.0]))


def test_top_p_keeps_smallest_prefix_past_p():
    # softmax of [3, 2, 1, 0, -1] = [.636, .234, .086, .032, .012]
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=0.8))
    assert ids.tolist() == [1, 2]
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=0.5))
    assert ids.tolist() == [1]


def test_min_p_drops_tokens_below_fraction_of_best():
    ids, _ = candidates(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1))
    assert ids.tolist() == [1, 2, 0]


@pytest.mark.parametrize("seed", [42, 0, -2])  # Ollama's: only -1 is random
def test_seed_repeats_the_same_draws(seed):
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=seed)
    a = [Sampler(params).sample(LOGITS) for _ in range(1)]
    draws = [Sampler(params) for _ in range(2)]
    seq = [[s.sample(LOGITS) for _ in range(50)] for s in draws]
    assert seq[0] == seq[1] and a[0] == seq[0][0]


def chi_square(draws: list[int], expected_probs: list[float]) -> float:
    n = len(draws)
    counts = torch.bincount(torch.tensor(draws), minlength=len(expected_probs)).double()
    expected = torch.tensor(expected_probs, dtype=torch.float64) * n
    return float(((counts - expected) ** 2 / expected).sum())


def test_draws_follow_the_distribution():
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=7))
    draws = [sampler.sample(LOGITS) for _ in range(20_000)]
    # chi-square critical value, 4 degrees of freedom, p = 0.001 (no scipy here)
    assert chi_square(draws, torch.softmax(LOGITS, 0).tolist()) < 18.47


def test_truncated_draws_follow_the_renormalized_distribution():
    # temperature 0.5 squares the weights e^x; top_k 3 keeps 1, 2, 0 (ids); top_p .99 keeps all 3
    sampler = Sampler(SamplingParams(temperature=0.5, top_k=3, top_p=0.99, seed=11))
    draws = [sampler.sample(LOGITS) for _ in range(20_000)]
    assert set(draws) == {0, 1, 2}
    w = [math.exp(2 * x) for x in (1.0, 3.0, 2.0)]
    # 2 degrees of freedom, p = 0.001
    assert chi_square(draws, [x / sum(w) for x in w]) < 13.82


def test_a_wrong_distribution_fails_the_chi_square():
    # the same draws against the untempered distribution: the check can fail
    sampler = Sampler(SamplingParams(temperature=0.5, top_k=3, top_p=1.0, seed=11))
    draws = [sampler.sample(LOGITS) for _ in range(20_000)]
    w = [math.exp(x) for x in (1.0, 3.0, 2.0)]
    assert chi_square(draws, [x / sum(w) for x in w]) > 100


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1},
        {"temperature": float("nan")},
        {"top_k": -1},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"typical_p": 0.0},
        {"typical_p": 1.01},
        {"repeat_penalty": 0.0},
        {"repeat_penalty": float("nan")},
        {"repeat_last_n": -1},
        {"presence_penalty": float("inf")},
    ],
)
def test_impossible_values_are_rejected(bad):
    with pytest.raises(OptionsError):
        SamplingParams(**bad)


# Penalties: llama.cpp's formula, dyadic values so float32 is exact.
PEN_LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
PEN = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)


def test_penalties_divide_positive_multiply_negative_then_subtract():
    out = penalize(PEN_LOGITS, {0: 1, 1: 2, 4: 1}, PEN)
    # 0: 2/2 - (.5 + .25); 1: -1*2 - (2*.5 + .25); 4: 0*2 - .75; 2 and 3 unseen
    assert out.tolist() == [0.25, -3.25, 0.5, 3.0, -0.75]
    assert PEN_LOGITS.tolist() == [2.0, -1.0, 0.5, 3.0, 0.0]  # the input is left alone


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(repeat_penalty=2.0), [1.0, -2.0, 0.5, 3.0, 0.0]),  # 0 * 2 stays 0
        (SamplingParams(presence_penalty=0.5), [1.5, -1.5, 0.5, 3.0, -0.5]),  # once per token
        (SamplingParams(frequency_penalty=0.5), [1.5, -2.0, 0.5, 3.0, -0.5]),  # per occurrence
        (SamplingParams(repeat_penalty=0.5), [4.0, -0.5, 0.5, 3.0, 0.0]),  # < 1 rewards repeats
    ],
)
def test_each_penalty_alone(params, expected):
    assert penalize(PEN_LOGITS, {0: 1, 1: 2, 4: 1}, params).tolist() == expected


def test_sampler_counts_only_the_last_repeat_last_n_tokens():
    sampler = Sampler(SamplingParams(temperature=0, repeat_last_n=2, repeat_penalty=4.0))
    sampler.accept_all([3, 3, 1, 3])  # window: [1, 3]
    assert dict(sampler.counts) == {1: 1, 3: 1}
    # 3.0 / 4 = 0.75 < 2.0: the penalty moves greedy off token 3, onto token 0
    assert sampler.sample(PEN_LOGITS) == 0
    unpenalized = Sampler(SamplingParams(temperature=0, repeat_last_n=0, repeat_penalty=4.0))
    unpenalized.accept_all([3, 3, 1, 3])
    assert unpenalized.sample(PEN_LOGITS) == 3 and not unpenalized.counts


def test_penalties_come_before_top_k():
    # token 3 (3.0) penalized to 0.375 drops out of top_k=2, leaving 0 (2.0) and 2 (0.5)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, repeat_penalty=8.0))
    sampler.accept(3)
    assert {sampler.sample(PEN_LOGITS) for _ in range(50)} <= {0, 2}


# probabilities 1/2, 1/4, 1/8, 1/8: entropy H = 1.75 ln 2, surprises 1, 2, 3, 3 (x ln 2),
# so |surprise - H| = .75, .25, 1.25, 1.25: typical order is token 1, 0, then 2, 3.
QUARTERS = torch.tensor([0.5, 0.25, 0.125, 0.125])


@pytest.mark.parametrize(
    ("mass", "ids", "probs"),
    [
        (0.2, [1], [1.0]),  # 1/4 > .2 already: the most typical, not the most likely
        (0.5, [0, 1], [2 / 3, 1 / 3]),  # 1/4 + 1/2 > .5
        (0.8, [0, 1, 2], [4 / 7, 2 / 7, 1 / 7]),  # 7/8 > .8
    ],
)
def test_typical_keeps_the_tokens_nearest_the_entropy(mass, ids, probs):
    kept_ids, kept = typical(torch.arange(4), QUARTERS.log(), mass)
    assert kept_ids.tolist() == ids
    assert torch.allclose(kept.softmax(-1), torch.tensor(probs))


@pytest.mark.parametrize("temperature", [0.3, 1.0, 3.0])
def test_typical_p_reads_the_distribution_before_temperature(temperature):
    # llama.cpp's chain: typical_p, then temperature; the set is the untempered one's
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, typical_p=0.5)
    ids, probs = candidates(QUARTERS.log(), params)
    assert ids.tolist() == [0, 1]
    ratio = 2.0 ** (1 / temperature)  # p0 / p1 = 2 before temperature
    assert float(probs[0] / probs[1]) == pytest.approx(ratio, rel=1e-5)


def test_typical_p_sits_after_softmax_before_top_p():
    logits = QUARTERS.log()
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, typical_p=0.2)
    assert candidates(logits, params)[0].tolist() == [1]
    # typical_p .8 keeps 0, 1, 2 at 4/7, 2/7, 1/7; top_p .6 then keeps the prefix 0, 1
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.6, typical_p=0.8)
    assert candidates(logits, params)[0].tolist() == [0, 1]


def test_logprobs_are_a_stable_log_softmax_of_the_raw_logits():
    logits = torch.tensor([1000.0, 1000.0 + math.log(3), -1000.0])  # naive exp overflows
    lp, top = logprobs(logits, 0, 2)
    # 1000 + ln 3 is stored to float32's 6e-5 step near 1000
    assert lp == pytest.approx(math.log(1 / 4), abs=1e-4)
    assert [i for i, _ in top] == [1, 0]
    assert [v for _, v in top] == pytest.approx([math.log(3 / 4), math.log(1 / 4)], abs=1e-4)
    assert logprobs(logits, 2, 0) == (pytest.approx(-2000.0 - math.log(4), abs=1e-3), [])


def test_logprobs_ties_are_ordered_by_id():
    _, top = logprobs(torch.zeros(30), 5, 20)
    assert [i for i, _ in top] == list(range(20))


@pytest.mark.parametrize("top_n", [-1, 21])
def test_logprobs_top_n_is_bounded(top_n):
    with pytest.raises(OptionsError, match="top_logprobs"):
        logprobs(LOGITS, 0, top_n)


@pytest.mark.model
def test_repeat_penalty_breaks_a_greedy_loop_on_smollm2(real_llm):
    llm = real_llm("smollm2:135m")
    greedy = {"temperature": 0, "num_predict": 24}

    def repeats(options: dict) -> int:
        tokens = llm.generate("the the the the", raw=True, options=options).tokens
        return len(tokens) - len(set(tokens))

    plain, penalized = repeats(greedy), repeats({**greedy, "repeat_penalty": 1.5})
    assert penalized < plain, (penalized, plain)
