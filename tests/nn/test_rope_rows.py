"""A decode step's RoPE tables from RopeRows' kept blocks against the tables computed for the
step's own positions (rope_tables of RoPE.cos_sin), for the position patterns steps have."""

import pytest
import torch

from ember.nn import RoPE
from ember.nn.rope import RopeRows, rope_tables

BLOCK = RopeRows.BLOCK
CASES = {
    "one token": [5],
    "first position": [0],
    "a block's last": [BLOCK - 1],
    "a short prompt": list(range(3, 13)),
    "a run across blocks": list(range(BLOCK - 3, BLOCK + 5)),
    "eight sequences": [700, 3, 64, 129, 4000, 31, 63, 65],
    "the same position twice": [9, 9],
    "far": [131_071, 200_000],
    "none": [],
}


def rope_of(kind: str) -> RoPE:
    if kind == "scaled":  # linear scaling and per-frequency divisors (llama 3.1's rope_freqs)
        return RoPE(16, 500000.0, False, scale=8.0, factors=torch.linspace(1, 4, 8))
    return RoPE(64, 10000.0, kind == "neox")


@pytest.mark.parametrize("kind", ["normal", "neox", "scaled"])
@pytest.mark.parametrize("case", list(CASES))
def test_rows_equal_the_steps_own_tables(kind, case):
    rope = rope_of(kind)
    rows = RopeRows(rope)
    positions = CASES[case]
    for _ in range(2):  # computed, then from the kept blocks
        cos, sin = rows(positions)
        want_cos, want_sin = rope_tables(rope.cos_sin(torch.tensor(positions)))
        assert cos.shape == want_cos.shape == (len(positions), rope.dim // 2)
        assert cos.is_contiguous() and sin.is_contiguous() and cos.dtype == torch.float32
        # bit-equal on the Zen 2; ~2 ulps allowed where torch's vectorized cosines (a block)
        # and its scalar ones (a step's own few) part in the last place
        torch.testing.assert_close(cos, want_cos, rtol=0, atol=2e-7)
        torch.testing.assert_close(sin, want_sin, rtol=0, atol=2e-7)


def test_only_the_last_blocks_are_kept():
    rows = RopeRows(RoPE(8, 10000.0, False))
    for block in range(RopeRows.KEEP + 10):
        rows([block * BLOCK])
    assert len(rows._blocks) == RopeRows.KEEP
    assert min(rows._blocks) == 10  # the least recently used went first
    rows([10 * BLOCK + 1])  # used again: now the most recent
    rows([(RopeRows.KEEP + 10) * BLOCK])
    assert 10 in rows._blocks and 11 not in rows._blocks
