"""The Pixtral vision tower and Mistral 3's projector, from Ollama's names (`v.patch_conv`,
`mm.linear_1`...) or llama.cpp's mmproj names (`v.patch_embd`, `mm.1`...).

Tower: patch conv (no bias), RMSNorm, pre-norm blocks (RMSNorm, attention with 2-D RoPE over
the patch rows and columns, RMSNorm, SiLU-gated MLP), every patch seeing every patch of its
image. Projector: RMSNorm, the patch merger (each spatial_merge_size² square of patches
concatenated, then a linear map), linear, GELU, linear. An image of h × w patches gives
(h / merge) × (w / merge) embeddings, row by row."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.model.config import Config
from ember.model.weights import Weights
from ember.nn import rms_norm
from ember.nn.attention import all_pairs

OLLAMA_NAMES = {
    "patch": "v.patch_conv.weight", "pre_norm": "v.encoder_norm.weight",
    "attn_norm": "v.blk.{}.attn_norm.weight", "ffn_norm": "v.blk.{}.ffn_norm.weight",
    "attn_q": "v.blk.{}.attn_q.weight", "attn_k": "v.blk.{}.attn_k.weight",
    "attn_v": "v.blk.{}.attn_v.weight", "attn_out": "v.blk.{}.attn_output.weight",
    "ffn_gate": "v.blk.{}.ffn_gate.weight", "ffn_up": "v.blk.{}.ffn_up.weight",
    "ffn_down": "v.blk.{}.ffn_down.weight", "mm_norm": "mm.norm.weight",
    "merger": "mm.patch_merger.merging_layer.weight", "linear_1": "mm.linear_1",
    "linear_2": "mm.linear_2",
}  # fmt: skip
LLAMA_CPP_NAMES = OLLAMA_NAMES | {
    "patch": "v.patch_embd.weight", "pre_norm": "v.pre_ln.weight",
    "attn_norm": "v.blk.{}.ln1.weight", "ffn_norm": "v.blk.{}.ln2.weight",
    "attn_out": "v.blk.{}.attn_out.weight", "mm_norm": "mm.input_norm.weight",
    "merger": "mm.patch_merger.weight", "linear_1": "mm.1", "linear_2": "mm.2",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PixtralOptions:
    num_layers: int
    hidden: int
    num_heads: int
    ffn: int
    patch_size: int
    longest_edge: int
    merge: int
    eps: float
    rope_base: float
    exact_gelu: bool  # the MLP's gate activation: GELU (some Pixtral mmproj files) or SiLU
    adjacent_pairs: bool  # Q/K rows permuted for ggml's RoPE (llama.cpp's converter)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @classmethod
    def from_config(cls, c: Config) -> "PixtralOptions":
        """From Ollama's mistral3.vision.* keys, or an mmproj file's clip.vision.* ones."""
        mmproj = c.arch == "clip"
        longest = "vision.image_size" if mmproj else "vision.longest_edge"
        merge_key = "vision.spatial_merge_size" if mmproj else "spatial_merge_size"
        return cls(
            num_layers=c.uint("vision.block_count", maximum=1024),
            hidden=c.uint("vision.embedding_length"),
            num_heads=c.uint("vision.attention.head_count", maximum=4096),
            ffn=c.uint("vision.feed_forward_length"),
            patch_size=c.uint("vision.patch_size", maximum=1024),
            longest_edge=c.uint(longest, c.uint("vision.image_size", 1540), maximum=1 << 15),
            merge=c.uint(merge_key, 1 if mmproj else 2, maximum=64),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-5),
            rope_base=c.float("vision.rope.freq_base", 10000.0),
            exact_gelu=mmproj and c.bool("use_gelu", False),
            adjacent_pairs=mmproj,
        )


class PixtralBlock:
    def __init__(self, w: Weights, i: int, o: PixtralOptions, names: dict[str, str]) -> None:
        c, f = o.hidden, o.ffn
        self.attn_norm = w.tensor(names["attn_norm"].format(i), (c,))
        self.ffn_norm = w.tensor(names["ffn_norm"].format(i), (c,))
        self.qkv = w.fused([names[f"attn_{n}"].format(i) for n in "qkv"], [c, c, c], c)
        self.out = w.linear(names["attn_out"].format(i), c, c)
        self.gate_up = w.fused([names["ffn_gate"].format(i), names["ffn_up"].format(i)], [f, f], c)
        self.down = w.linear(names["ffn_down"].format(i), c, f)

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, o: PixtralOptions
    ) -> torch.Tensor:
        qkv = self.qkv(rms_norm(x, self.attn_norm, o.eps)).unflatten(-1, (3, o.num_heads, -1))
        q, k, v = (t.transpose(0, 1) for t in qkv.unbind(1))  # (H, N, D) each
        q, k = (_rotate(t, cos, sin, adjacent=o.adjacent_pairs) for t in (q, k))
        att = all_pairs(q, k, v)  # every patch sees every patch
        x = x + self.out(att.transpose(0, 1).flatten(1))
        gate, up = self.gate_up(rms_norm(x, self.ffn_norm, o.eps)).chunk(2, dim=-1)
        gate = F.gelu(gate) if o.exact_gelu else F.silu(gate)
        return x + self.down(gate * up)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, adjacent: bool
) -> torch.Tensor:
    """RoPE of x (H, N, D) by angles (N, D/2): the pairs (i, i + D/2) as HF's rotate_half, or
    (2i, 2i + 1) where the rows were permuted for ggml."""
    if adjacent:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_angles(rows: int, cols: int, o: PixtralOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (rows * cols, D/2) of HF's axial 2-D RoPE: the first D/4 frequencies (the
    even ones) turn with the patch's row, the last D/4 (the odd ones) with its column."""
    d = o.head_dim
    inv_freq = 1.0 / (o.rope_base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    row = torch.arange(rows, dtype=torch.float32).repeat_interleave(cols)
    col = torch.arange(cols, dtype=torch.float32).repeat(rows)
    angles = torch.cat((row[:, None] * inv_freq[0::2], col[:, None] * inv_freq[1::2]), dim=-1)
    return angles.cos(), angles.sin()


class PixtralTower:
    """Pixels (3, H, W), H and W multiples of patch_size * merge -> embeddings
    (H / patch / merge, W / patch / merge, text hidden)."""

    def __init__(
        self,
        w: Weights,
        o: PixtralOptions,
        text_hidden: int,
        text_eps: float,
        names: dict[str, str],
    ) -> None:
        c, p, m = o.hidden, o.patch_size, o.merge
        self.options, self.text_eps = o, text_eps
        self.patch = w.tensor(names["patch"], (c, 3, p, p))
        self.pre_norm = w.tensor(names["pre_norm"], (c,))
        self.blocks = [PixtralBlock(w, i, o, names) for i in range(o.num_layers)]
        self.mm_norm = w.optional(names["mm_norm"], (c,))  # absent without a patch merger
        self.merger = w.linear(names["merger"], c, c * m * m) if m > 1 else None
        self.linear_1 = w.linear(f"{names['linear_1']}.weight", text_hidden, c)
        self.bias_1 = w.optional(f"{names['linear_1']}.bias", (text_hidden,))
        self.linear_2 = w.linear(f"{names['linear_2']}.weight", text_hidden, text_hidden)
        self.bias_2 = w.optional(f"{names['linear_2']}.bias", (text_hidden,))

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        o = self.options
        x = F.conv2d(pixels[None], self.patch, stride=o.patch_size)[0]  # (C, rows, cols)
        rows, cols = x.shape[1:]
        x = rms_norm(x.flatten(1).T, self.pre_norm, o.eps)  # (N, C), row by row
        cos, sin = rope_angles(rows, cols, o)
        for block in self.blocks:
            x = block(x, cos, sin, o)
        if self.mm_norm is not None:
            x = rms_norm(x, self.mm_norm, self.text_eps)  # HF: the text model's rms_norm_eps
        if self.merger is not None:  # each merge × merge square, channels first, as F.unfold
            grid = x.T.reshape(1, o.hidden, rows, cols)
            x = self.merger(F.unfold(grid, o.merge, stride=o.merge)[0].T)
            rows, cols = rows // o.merge, cols // o.merge
        x = F.gelu(_add(self.linear_1(x), self.bias_1))
        return _add(self.linear_2(x), self.bias_2).reshape(rows, cols, -1)


def _add(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x if bias is None else x + bias
