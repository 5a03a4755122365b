"""An encoder's attention in query blocks equals torch's SDPA over all the scores at once."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from ember.nn.attention import all_pairs

attention_module = importlib.import_module("ember.nn.attention")  # (ember.nn.attention: a function)


@pytest.mark.parametrize("scale", [None, 1.0])
@pytest.mark.parametrize("leading", [(3,), (2, 3)])
def test_blocks_equal_sdpa(monkeypatch, leading, scale):
    torch.manual_seed(0)
    q, k, v = (torch.randn(*leading, 37, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert torch.allclose(all_pairs(q, k, v, scale=scale), expected, atol=1e-6)  # one call
    monkeypatch.setattr(attention_module, "SCORES_BYTES", 4 * 6 * 37 * 5)  # blocks of 5 or 2 rows
    assert torch.allclose(all_pairs(q, k, v, scale=scale), expected, atol=1e-6)
