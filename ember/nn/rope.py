"""Rotary position embedding in ggml's two layouts: "normal" (adjacent pairs) and NeoX (halves)."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class RoPE:
    dim: int  # rotated dimensions of each head (the first `dim`; the rest pass through)
    base: float
    is_neox: bool
    scale: float = 1.0  # linear position scaling (positions are divided by it)
    factors: torch.Tensor | None = None  # per-frequency divisors (llama 3.1 rope_freqs)

    def inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim
        inv = 1.0 / (self.base**exponents)
        if self.factors is not None:
            inv = inv / self.factors.to(torch.float64)
        return inv

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosines and sines (T, 1, dim/2) for integer positions (T,)."""
        angles = positions.to(torch.float64)[:, None] / self.scale * self.inv_freq()[None, :]
        return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates x (T, H, D) by the angles of cos_sin."""
        rot, rest = x[..., : self.dim], x[..., self.dim :]
        if self.is_neox:
            x0, x1 = rot.chunk(2, dim=-1)
            out = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
        else:
            pairs = rot.unflatten(-1, (-1, 2))
            x0, x1 = pairs[..., 0], pairs[..., 1]
            out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
        return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)

    def shift(self, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Re-rotates cached keys (H, n, D) whose positions moved by delta (n,)."""
        cos, sin = self.cos_sin(delta)  # (n, 1, dim/2)
        return self.apply(key.transpose(0, 1), cos, sin).transpose(0, 1)
