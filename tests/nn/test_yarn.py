"""YaRN (ember/nn/yarn.py) against transformers' own YaRN parameters with ggml's rounding
(`truncate`), for gpt-oss's settings and a small model's."""

import pytest
import torch

from ember.nn import RoPE
from ember.nn.yarn import yarn_attention_factor, yarn_factors

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("dim", "base", "factor", "original"), [(64, 150000.0, 32.0, 4096), (16, 10000.0, 4.0, 32)]
)
def test_yarn_frequencies_and_scale_equal_transformers(dim, base, factor, original):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "truncate": True,
            "original_max_position_embeddings": original}  # fmt: skip
    config = transformers.GptOssConfig(head_dim=dim, rope_parameters=rope)
    inv_freq, scale = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = RoPE(dim, base, True, factors=yarn_factors(dim, base, factor, original)).inv_freq()
    assert torch.allclose(ours.float(), inv_freq.float(), rtol=1e-6)
    assert yarn_attention_factor(factor) == pytest.approx(scale)
