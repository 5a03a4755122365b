"""logit_bias (OpenAI's): added before sampling, clamped to [-100, 100], -100 bans; the batched
step gives each row the token its own Sampler.sample gives."""

import torch

from ember.sample import SamplingParams
from ember.sample.batched import sample_rows
from ember.sample.sampler import Sampler, biased

VOCAB = 50


def logits(seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_bias_is_added_clamped_and_minus_100_bans() -> None:
    x = torch.zeros(2, VOCAB)
    out = biased(x, [((3, 2.5), (4, 1000.0), (5, -100.0)), ((3, -250.0), (VOCAB + 9, 1.0))])
    assert out[0, 3] == 2.5 and out[0, 4] == 100.0 and out[0, 5] == float("-inf")
    assert out[1, 3] == float("-inf")  # clamped to -100: banned
    assert out[0, :3].eq(0).all() and out[1, 4:].eq(0).all()  # the rest, and ids past V, untouched
    assert x.eq(0).all()  # a copy


def test_a_banned_token_is_never_drawn_and_a_pushed_one_always() -> None:
    row = logits(0)[0]
    top = int(row.argmax())
    banned = Sampler(SamplingParams(temperature=0, logit_bias=((top, -100.0),)))
    assert banned.sample(row) != top
    pushed = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=1, logit_bias=((7, 100.0),))
    sampler = Sampler(pushed)
    assert {sampler.sample(logits(i)[0]) for i in range(20)} == {7}


def test_batched_rows_with_and_without_bias_match_each_sampler_alone() -> None:
    params = [
        SamplingParams(temperature=0, logit_bias=((1, 5.0), (2, -100.0))),
        SamplingParams(temperature=1.0, top_k=10, seed=3, logit_bias=((9, 3.0),)),
        SamplingParams(temperature=1.0, top_k=0, top_p=0.9, seed=4),
        SamplingParams(
            temperature=0.8,
            top_k=0,
            top_p=1.0,
            repeat_penalty=1.3,
            seed=5,
            logit_bias=tuple((t, -2.0) for t in range(0, VOCAB, 3)),
        ),
    ]
    batched = [Sampler(p) for p in params]
    alone = [Sampler(p) for p in params]
    for step in range(30):
        x = logits(100 + step, len(params))
        tokens = sample_rows(batched, x)
        assert tokens == [s.sample(row) for s, row in zip(alone, x, strict=True)], step
        for a, b, t in zip(batched, alone, tokens, strict=True):
            a.accept(t)
            b.accept(t)
