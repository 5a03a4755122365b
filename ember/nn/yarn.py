"""YaRN RoPE scaling (gpt-oss) as ggml computes it: each frequency blends its interpolated and
extrapolated values by a ramp between two correction dimensions, expressed here as per-frequency
divisors for RoPE's `factors`, and cosines and sines scaled by 0.1 * ln(factor) + 1."""

import math

import torch


def yarn_factors(
    dim: int, base: float, factor: float, original_context: int, *, beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """Divisors (dim / 2,) of RoPE's inverse frequencies (ggml_rope_yarn_corr_dims + ramp)."""

    def corr_dim(rotations: float) -> float:
        return dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(beta_fast)))
    high = min(dim - 1.0, math.ceil(corr_dim(beta_slow)))
    index = torch.arange(dim // 2, dtype=torch.float64)
    ramp = ((index - low) / max(0.001, high - low)).clamp(0, 1)
    extrapolated = 1.0 - ramp  # 1: the frequency keeps its value; 0: divided by factor
    return (1.0 / ((1.0 - extrapolated) / factor + extrapolated)).float()


def yarn_attention_factor(factor: float) -> float:
    """What YaRN multiplies cosines and sines by (so queries and keys, each once)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
