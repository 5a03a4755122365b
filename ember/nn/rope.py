"""Rotary position embedding in ggml's two layouts: "normal" (adjacent pairs) and NeoX (halves).

A forward pass builds one Rotation for its positions (`RoPE.rotation`): cosine and signed sine
tables of one head, and each group of heads' scale (the attention's scale on the queries), so a
layer rotates its queries and keys together: x * cos + partner(x) * sin, where partner(x) swaps
each rotated dimension with the other of its pair, then the scaled heads times their scale.
"""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.backend.norm import qk_rope_rows


def rope_tables(cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE.cos_sin's (T, 1, dim/2) tables as the native kernels read them: (T, dim/2)."""
    cos, sin = cos_sin
    rows, half = cos.shape[0], cos.shape[-1]
    return cos.reshape(rows, half).contiguous(), sin.reshape(rows, half).contiguous()


class RopeRows:
    """A RoPE's cos_sin tables as the native layers read them, (T, dim/2) float32 each, for a
    decode step's few positions: computed BLOCK positions at a time and kept (the last KEEP
    blocks), so a step slices rows: computing a step's own took ~10 torch ops, 0.21 ms of
    SmolLM2's 8.8 ms decode step on the Zen 2 (timed around the call in a loop of steps)."""

    BLOCK = 64
    KEEP = 32  # blocks: 2,048 positions, ~1 MB for 128-dimension heads

    def __init__(self, rope: "RoPE") -> None:
        self.rope = rope
        self._blocks: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __call__(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (len(positions), dim/2) contiguous float32."""
        if not positions:
            return rope_tables(self.rope.cos_sin(torch.zeros(0, dtype=torch.long)))
        first, n = positions[0], len(positions)
        block, at = divmod(first, self.BLOCK)
        if at + n <= self.BLOCK and all(p == first + i for i, p in enumerate(positions)):
            cos, sin = self._block(block)  # consecutive in one block: one slice each
            return cos[at : at + n], sin[at : at + n]
        rows = [self._row(p) for p in positions]
        return torch.cat([c for c, _ in rows]), torch.cat([s for _, s in rows])

    def _row(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        block, at = divmod(position, self.BLOCK)
        cos, sin = self._block(block)
        return cos[at : at + 1], sin[at : at + 1]

    def _block(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        tables = self._blocks.get(block)
        if tables is None:
            start = block * self.BLOCK
            tables = rope_tables(self.rope.cos_sin(torch.arange(start, start + self.BLOCK)))
            self._blocks[block] = tables
            if len(self._blocks) > self.KEEP:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(block)
        return tables


@dataclass(frozen=True, slots=True)
class Rotation:
    """RoPE (and a per-head scale) for the tokens of one batch: apply to x (T, N, D)."""

    cos: torch.Tensor  # (T, 1, D), shared by every head
    sin: torch.Tensor  # (T, 1, D), negated where a dimension takes its partner's minus sine
    dim: int  # the rotated dimensions (the rest pair with themselves, their sine 0)
    is_neox: bool
    groups: tuple[tuple[int, float], ...]  # (heads, scale) of x's heads in order
    half_cos: torch.Tensor | None = None  # (T, dim/2), as the native kernels read them
    half_sin: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addcmul(x * self.cos, self.partner(x), self.sin)
        start = 0
        for count, scale in self.groups:
            if scale != 1.0:
                out.narrow(-2, start, count).mul_(scale)
            start += count
        return out

    def heads_of(
        self,
        x: torch.Tensor,
        heads: int,
        head_dim: int,
        norms: tuple[torch.Tensor, torch.Tensor] | None = None,
        eps: float = 0.0,
    ) -> torch.Tensor:
        """The first `heads` heads of head_dim values in each row of x (T, W), RMS-normalised
        where norms gives their weights (the first group's heads, then the rest's), rotated and
        scaled: (T, heads, head_dim), as a q/k-norm model's q and k. One native pass where the
        kernels take it (backend/norm.py's qk_rope_rows), else torch's ops."""
        out = qk_rope_rows(x, heads, head_dim, self, norms, eps)
        if out is not None:
            return out
        h = x[:, : heads * head_dim].view(x.shape[0], heads, head_dim)
        if norms is not None:
            first = self.groups[0][0]
            h = F.rms_norm(h, (head_dim,), None, eps)
            h[:, :first] *= norms[0]
            h[:, first:] *= norms[1]
        return self(h)

    def partner(self, x: torch.Tensor) -> torch.Tensor:
        """x with each rotated dimension swapped with the other of its pair: contiguous copies
        (a gather by index, index_select, took 1.2 ms of Gemma 3's 1.5 ms RoPE on 512 tokens)."""
        rot, rest = x[..., : self.dim], x[..., self.dim :]
        if self.is_neox:  # the two halves trade places
            half = self.dim // 2
            parts = [rot[..., half:], rot[..., :half]]
        else:  # each adjacent pair trades places
            pairs = rot.unflatten(-1, (-1, 2))
            parts = [torch.stack((pairs[..., 1], pairs[..., 0]), -1).flatten(-2)]
        if rest.shape[-1]:
            parts.append(rest)
        return torch.cat(parts, -1) if len(parts) > 1 else parts[0]


@dataclass(frozen=True, slots=True)
class RoPE:
    dim: int  # rotated dimensions of each head (the first `dim`; the rest pass through)
    base: float
    is_neox: bool
    scale: float = 1.0  # linear position scaling (positions are divided by it)
    factors: torch.Tensor | None = None  # per-frequency divisors (llama 3.1 rope_freqs)
    magnitude: float = 1.0  # YaRN's factor on the cosines and sines (so on queries and keys)

    def inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim
        inv = 1.0 / (self.base**exponents)
        if self.factors is not None:
            inv = inv / self.factors.to(torch.float64)
        return inv

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosines and sines (T, 1, dim/2) for integer positions (T,), times the magnitude."""
        cos, sin = self.turns(positions)
        if self.magnitude == 1.0:
            return cos, sin
        return cos * self.magnitude, sin * self.magnitude

    def turns(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosines and sines (T, 1, dim/2) of the angles alone: a shift's turn of a cached key,
        which had its magnitude when it was first rotated."""
        angles = positions.to(torch.float64)[:, None] / self.scale * self.inv_freq()[None, :]
        return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]

    def rotation(
        self, positions: torch.Tensor, head_dim: int, groups: list[tuple[int, float]]
    ) -> Rotation:
        """The Rotation of positions (T,) for heads of head_dim in groups of (count, scale):
        e.g. [(num_heads, attention scale), (num_kv_heads, 1.0)] for q and k side by side."""
        cos, sin = self.cos_sin(positions)  # (T, 1, dim/2)
        if self.is_neox:  # dimension i pairs with i + dim/2
            cos_d, sin_d = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
        else:  # dimension 2i pairs with 2i + 1
            cos_d = cos.repeat_interleave(2, -1)
            sin_d = torch.stack((-sin, sin), -1).flatten(-2)
        rest = head_dim - self.dim
        if rest:  # the dimensions past dim pass through
            n = cos_d.shape[0]
            cos_d = torch.cat((cos_d, torch.ones(n, 1, rest)), -1)
            sin_d = torch.cat((sin_d, torch.zeros(n, 1, rest)), -1)
        # tables of one head, broadcast over all: (T, N, D) ones, the scales folded in, were
        # 16 MB through a 3B model's 512-token batch
        half = (
            cos.reshape(cos.shape[0], -1).contiguous(),
            sin.reshape(sin.shape[0], -1).contiguous(),
        )
        return Rotation(cos_d, sin_d, self.dim, self.is_neox, tuple(groups), *half)

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
        cos, sin = self.turns(delta)  # (n, 1, dim/2)
        return self.apply(key.transpose(0, 1), cos, sin).transpose(0, 1)
