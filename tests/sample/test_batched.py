"""sample_rows against each row's own Sampler.sample, step after step; the canonical top-k and
argmax against torch's sort and argmax; a row's tokens whatever its batch."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from native_isas import ISAS

from ember.gguf import GGUFFile
from ember.sample import SamplingParams, topk
from ember.sample.batched import sample_rows
from ember.sample.grammar import Grammar, constrain
from ember.sample.sampler import Sampler
from ember.sample.topk import BLOCK, argmax_rows, block_maxima, sorted_row, top_k_rows
from ember.tokenizer import Tokenizer

# penalized and masked too in some rows: each change to the caller's logits must be undone
BIAS = ((5, 4.0), (7, -100.0), (11, -2.5), (10**6, 1.0))  # the last past every vocabulary

# one of each kind of row; seeds differ so that no two rows draw alike
ROWS: list[SamplingParams] = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0, repeat_penalty=1.5, presence_penalty=0.5, logit_bias=BIAS),
    SamplingParams(seed=1),  # Ollama's defaults: temperature .8, top_k 40, top_p .9
    SamplingParams(temperature=1.0, top_k=5, top_p=1.0, seed=2),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.7, seed=3),
    SamplingParams(temperature=1.0, top_k=30, top_p=1.0, min_p=0.05, seed=4),
    SamplingParams(temperature=0.9, top_k=20, top_p=1.0, typical_p=0.8, seed=5),
    SamplingParams(temperature=1.0, top_k=10, repeat_penalty=1.3, frequency_penalty=0.2, seed=6),
    SamplingParams(temperature=0.8, top_k=8, logit_bias=BIAS, seed=10),
    SamplingParams(temperature=0.7, top_k=0, top_p=0.95, seed=7),  # full sort
    SamplingParams(temperature=1.0, top_k=10**9, top_p=0.9, min_p=0.1, seed=8),  # k >= V
    SamplingParams(temperature=1.0, top_k=1, seed=9),
]
MASKED = {1, 3, 4, 8, 11}  # rows given a grammar mask


class FixedMask:
    """A stand-in grammar for `constrain`: it allows the tokens of a given mask."""

    def __init__(self, allowed: torch.Tensor) -> None:
        self.allowed = allowed

    def mask(self) -> torch.Tensor:
        return self.allowed


def random_mask(gen: torch.Generator, size: int, step: int) -> torch.Tensor:
    """A few allowed tokens on some steps (fewer than top_k), many on others, as a grammar."""
    share = 0.0005 if step % 3 == 0 else 0.3
    mask = torch.rand(size, generator=gen) < share
    mask[int(torch.randint(size, (1,), generator=gen))] = True  # never empty
    return mask


def one_by_one(samplers: list[Sampler], logits: torch.Tensor, masks: list) -> list[int]:
    """The reference: each row alone through constrain and Sampler.sample."""
    out = []
    for s, row, mask in zip(samplers, logits, masks, strict=True):
        out.append(s.sample(row if mask is None else constrain(row, FixedMask(mask))))
    return out


def accept(samplers: list[Sampler], tokens: list[int]) -> None:
    for s, t in zip(samplers, tokens, strict=True):
        s.accept(t)


@pytest.mark.parametrize(
    ("vocab_size", "mask_size", "tied"),
    [
        (30_037, 30_037, False),  # block search, a tail past the last full block
        (30_037, 29_000, True),  # masks shorter than the logits; integer logits full of ties
        (700, 720, False),  # few blocks: plain topk; masks longer than the logits
        (130, 130, True),
    ],
)
def test_rows_equal_their_sampler_alone(vocab_size: int, mask_size: int, tied: bool) -> None:
    gen = torch.Generator().manual_seed(vocab_size + tied)
    batched = [Sampler(p) for p in ROWS]
    alone = copy.deepcopy(batched)  # same generator states, same recent tokens
    prompt = [5, 7, 11, *torch.randint(vocab_size, (20,), generator=gen).tolist()]
    for s in batched + alone:
        s.accept_all(prompt)
    for step in range(30):
        logits = torch.randn(len(ROWS), vocab_size, generator=gen) * 3
        if tied:
            logits = logits.round()
        masks = [random_mask(gen, mask_size, step) if r in MASKED else None for r in range(12)]
        before = logits.clone()
        tokens = sample_rows(batched, logits, masks)
        assert tokens == one_by_one(alone, logits, masks), step
        assert torch.equal(logits, before)  # the caller's logits are left alone
        accept(batched, tokens)
        accept(alone, tokens)


def test_sample_rows_leaves_recent_tokens_alone() -> None:
    sampler = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=4, seed=0))
    sampler.accept_all([1, 2, 2])
    sample_rows([sampler], torch.randn(1, 50))
    assert list(sampler.recent) == [1, 2, 2] and dict(sampler.counts) == {1: 1, 2: 2}


def test_a_seeded_row_gives_its_tokens_whatever_shares_the_batch() -> None:
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=42)
    gen = torch.Generator().manual_seed(0)
    steps = [torch.randn(20_000, generator=gen) * 3 for _ in range(40)]

    def tokens(neighbours: list[SamplingParams], at: int) -> list[int]:
        samplers = [Sampler(p) for p in neighbours]
        samplers.insert(at, Sampler(params))
        out = []
        for row in steps:
            logits = torch.randn(len(samplers), row.numel(), generator=gen) * 3
            logits[at] = row
            out.append(sample_rows(samplers, logits)[at])
        return out

    alone = tokens([], 0)
    assert len(set(alone)) > 5  # a real random walk
    assert tokens(ROWS[:4], 2) == alone
    assert tokens(ROWS, 11) == alone
    assert tokens([SamplingParams(top_k=200, seed=3)] * 3, 1) == alone  # a larger batch top-k


# torch's operators, then each native copy (sample.h) that this CPU runs
PATHS = [pytest.param(None, id="torch"), *ISAS]


@pytest.fixture(params=PATHS)
def kernel_path(request, monkeypatch) -> None:
    if request.param is None:
        monkeypatch.setattr(topk, "_native", lambda logits: None)
    else:
        monkeypatch.setenv("EMBER_CPU_ISA", request.param)
        assert topk._native(torch.zeros(1, BLOCK)) is not None


@pytest.mark.usefixtures("kernel_path")
def test_argmax_rows_is_torch_argmax_ties_and_nan_included() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-5, 3, (9, 10 * BLOCK + 5), generator=gen).float()  # many ties
    logits[1, -2] = 9.0  # the max in the tail
    logits[2, 3 * BLOCK + 7] = float("nan")
    logits[3] = float("-inf")
    logits[4, [BLOCK + 1, 7 * BLOCK]] = float("nan")  # the first NaN wins
    logits[5, -1] = float("nan")  # in the tail
    logits[6] = -0.0
    logits[6, 5 * BLOCK + 2] = 0.0  # equal to -0.0: the first still wins
    logits[7, 2 * BLOCK + 9] = float("inf")
    rows = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    maxima = block_maxima(logits)
    whole = logits[:, : 10 * BLOCK].view(9, 10, BLOCK).amax(2)
    torch.testing.assert_close(maxima, whole, rtol=0, atol=0, equal_nan=True)
    got = argmax_rows(logits, rows, maxima)
    assert got == logits[rows].argmax(1).tolist()
    expected = [10 * BLOCK + 3, 3 * BLOCK + 7, 0, BLOCK + 1, 10 * BLOCK + 4, 0, 2 * BLOCK + 9]
    assert got[1:8] == expected
    short = torch.randn(3, BLOCK - 1, generator=gen)  # no whole block: the rows themselves
    assert argmax_rows(short, [2, 0], block_maxima(short)) == short[[2, 0]].argmax(1).tolist()


def oracle_top_k(row: torch.Tensor, k: int) -> tuple[list[float], list[int]]:
    """Descending, ties by id: a stable sort of the whole row."""
    values, ids = row.sort(descending=True, stable=True)
    return values[:k].tolist(), ids[:k].tolist()


@pytest.mark.parametrize("vocab_size", [100, 300 * BLOCK + 17])
def test_top_k_rows_is_a_stable_sort_cut_at_k(vocab_size: int) -> None:
    gen = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(5, vocab_size, generator=gen) * 3
    logits[1] = logits[1].round()  # ties everywhere, across the cut too
    logits[2] = 0.0  # one tie of the whole row
    logits[3, ::7] = logits[3, 5]  # a tied group larger than the candidates searched
    rows, ks = [0, 1, 2, 3, 4], [40, 25, 7, 40, 1]
    got = top_k_rows(logits, rows, ks, block_maxima(logits))
    for r, k, (values, ids) in zip(rows, ks, got, strict=True):
        assert (values.tolist(), ids.tolist()) == oracle_top_k(logits[r], k), r


def test_top_k_rows_with_masked_tokens_keeps_the_allowed_ones_in_order() -> None:
    logits = torch.full((1, 100 * BLOCK), float("-inf"))
    allowed = [5, 4000, 77, 6000]
    logits[0, allowed] = torch.tensor([1.0, 3.0, 1.0, 2.0])
    values, ids = top_k_rows(logits, [0], [40], block_maxima(logits))[0]
    assert ids[:4].tolist() == [4000, 6000, 5, 77] and values[4:].isinf().all()
    assert values.numel() == 40  # the -inf rest is kept, as torch.topk: the draw's shape


def test_sorted_row_orders_ties_by_id() -> None:
    values, ids = sorted_row(torch.tensor([1.0, 2.0, 1.0, 2.0]))
    assert ids.tolist() == [1, 3, 0, 2] and values.tolist() == [2.0, 2.0, 1.0, 1.0]


def test_a_nan_row_is_an_error_as_alone() -> None:
    samplers = [Sampler(SamplingParams(seed=0)), Sampler(SamplingParams(seed=1))]
    logits = torch.randn(2, 300)
    logits[1, 7] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        sample_rows(samplers, logits)
    with pytest.raises(ValueError, match="NaN"):
        samplers[1].sample(logits[1])


def test_shapes_are_checked() -> None:
    samplers = [Sampler(SamplingParams(seed=0))] * 2
    with pytest.raises(ValueError, match=r"\(R, V\)"):
        sample_rows(samplers, torch.zeros(3, 10))
    with pytest.raises(ValueError, match="masks"):
        sample_rows(samplers, torch.zeros(2, 10), [None])


@pytest.mark.model
def test_real_grammar_masks_keep_every_row_valid(smollm2_path: Path) -> None:
    tok = Tokenizer.from_metadata(GGUFFile.open(smollm2_path).metadata)
    schema = {
        "type": "object",
        "properties": {"a": {"enum": ["x", "y"]}, "b": {"type": "string", "maxLength": 4}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    formats: list[Any] = [{"regex": "(yes|no)!"}, schema, schema, {"regex": "[0-9]{3}"}]
    grammars = [Grammar.from_format(f, tok) for f in formats]
    samplers = [
        Sampler(SamplingParams(temperature=1.0, top_k=k, seed=i))
        for i, k in enumerate([40, 0, 5, 40])
    ]
    outputs: list[list[int]] = [[] for _ in formats]
    gen = torch.Generator().manual_seed(0)
    active = list(range(len(formats)))
    for _ in range(100):
        logits = torch.randn(len(active), tok.vocab_size + 64, generator=gen) * 3  # padded head
        masks = [grammars[r].mask().clone() for r in active]
        tokens = sample_rows([samplers[r] for r in active], logits, masks)
        for r, mask, token in zip(list(active), masks, tokens, strict=True):
            assert token < tok.vocab_size and mask[token]
            if token in tok.eos_ids:  # any end token ends a row, as in the engine
                active.remove(r)
            else:
                grammars[r].accept(token)
                outputs[r].append(token)
        if not active:
            break
    texts = [tok.decode(out) for out in outputs]
    assert texts[0] in ("yes!", "no!") and texts[3].isdigit() and len(texts[3]) == 3
    for text in texts[1:3]:
        assert set(json.loads(text)) == {"a", "b"}
