"""Qwen3-VL's vision side (Ollama's `qwen3vl` and `qwen3vlmoe` files, `v.*`): patches as Qwen
2.5 VL's (HF's Qwen2VLImageProcessor: smart resize, bicubic, in merge-window order), a Conv3d
patch embedding with a learned position grid resampled bilinearly to the image's, 2-D RoPE, full
attention in LayerNorm/GELU blocks, and a patch merger. Deepstack: the blocks Ollama's
`vision.deepstack_visual_indexes` name each feed their own merger, whose outputs the text model
adds to its hidden states after its first layers (one merger per layer, in order)."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.model.archs.bert import layer_norm, layer_norm_weights
from ember.model.archs.qwen25vl_vision import Patches, _angles, _rotate
from ember.model.config import Config, ModelLoadError
from ember.model.weights import Weights
from ember.nn.attention import all_pairs

MIN_PIXELS = 64 << 10  # Ollama's default shortest edge (the model's own)
MAX_PIXELS = 2 << 20  # Ollama's cap on the model's 16 M pixels (a default context's worth)
HALF = (0.5, 0.5, 0.5)


@dataclass(frozen=True, slots=True)
class VisionOptions:
    num_layers: int
    hidden: int
    num_heads: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    deepstack: tuple[int, ...]  # the blocks whose outputs feed the deepstack mergers
    eps: float
    rope_base: float
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_config(cls, c: Config) -> "VisionOptions":
        """Ollama's {arch}.vision.* keys (its converter's, with its defaults)."""
        layers = c.uint("vision.block_count", 32, maximum=1024)
        deepstack = c.metadata.get(f"{c.arch}.vision.deepstack_visual_indexes") or []
        if not isinstance(deepstack, list) or not all(
            isinstance(i, int) and 0 <= i < layers for i in deepstack
        ):
            raise ModelLoadError("vision.deepstack_visual_indexes must list block numbers")
        most = min(c.count("vision.longest_edge", maximum=1 << 28) or MAX_PIXELS, MAX_PIXELS)
        return cls(
            num_layers=layers,
            hidden=c.uint("vision.embedding_length", 1280),
            num_heads=c.uint("vision.attention.head_count", 16, maximum=4096),
            patch_size=c.uint("vision.patch_size", 14, maximum=1024),
            merge_size=c.uint("vision.spatial_merge_size", 2, maximum=64),
            temporal_patch_size=c.uint("vision.temporal_patch_size", 2, maximum=16),
            deepstack=tuple(deepstack),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-6),
            rope_base=c.float("vision.rope.freq_base", 10000.0),
            min_pixels=min(c.count("vision.shortest_edge", maximum=1 << 28) or MIN_PIXELS, most),
            max_pixels=most,
            mean=_triple(c, "vision.image_mean"),
            std=_triple(c, "vision.image_std"),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def unit(self) -> int:
        """Patches merged into one image token."""
        return self.merge_size**2


def _triple(c: Config, key: str) -> tuple[float, float, float]:
    value = c.metadata.get(f"{c.arch}.{key}") or list(HALF)
    if not isinstance(value, list) or len(value) != 3:
        raise ModelLoadError(f"{key} must list 3 numbers")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
        raise ModelLoadError(f"{key} must list 3 numbers")
    if key.endswith("std") and not all(x > 0 for x in value):
        raise ModelLoadError(f"{key} must be positive")
    return float(value[0]), float(value[1]), float(value[2])


class Merger:
    """A patch merger: LayerNorm (over each patch, or over the merged four: `postshuffle`),
    then Linear, GELU, Linear to the text model's width."""

    def __init__(self, w: Weights, prefix: str, o: VisionOptions, out: int, postshuffle: bool):
        u = o.hidden * o.unit
        self.norm = layer_norm_weights(w, prefix + "norm", u if postshuffle else o.hidden)
        self.fc1 = w.linear(prefix + "linear_fc1.weight", u, u)
        self.fc1_bias = w.tensor(prefix + "linear_fc1.bias", (u,))
        self.fc2 = w.linear(prefix + "linear_fc2.weight", out, u)
        self.fc2_bias = w.tensor(prefix + "linear_fc2.bias", (out,))
        self.unit, self.eps, self.postshuffle = o.unit, o.eps, postshuffle

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        u = x.shape[-1] * self.unit
        if self.postshuffle:
            x = layer_norm(x.reshape(-1, u), self.norm, self.eps)
        else:
            x = layer_norm(x, self.norm, self.eps).reshape(-1, u)
        return self.fc2(F.gelu(self.fc1(x) + self.fc1_bias)) + self.fc2_bias


class VisionBlock:
    def __init__(self, w: Weights, i: int, o: VisionOptions, ffn: int) -> None:
        p, c = f"v.blk.{i}.", o.hidden
        self.norm1, self.norm2 = (layer_norm_weights(w, p + n, c) for n in ("norm1", "norm2"))
        self.qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], [c, c, c], c)
        self.qkv_bias = torch.cat([w.tensor(p + f"attn_{n}.bias", (c,)) for n in "qkv"])
        self.out = w.linear(p + "attn_out.weight", c, c)
        self.out_bias = w.tensor(p + "attn_out.bias", (c,))
        self.fc1 = w.linear(p + "mlp.linear_fc1.weight", ffn, c)
        self.fc1_bias = w.tensor(p + "mlp.linear_fc1.bias", (ffn,))
        self.fc2 = w.linear(p + "mlp.linear_fc2.weight", c, ffn)
        self.fc2_bias = w.tensor(p + "mlp.linear_fc2.bias", (c,))
        self.eps, self.num_heads = o.eps, o.num_heads

    def __call__(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n, c = x.shape
        h = layer_norm(x, self.norm1, self.eps)
        q, k, v = (self.qkv(h) + self.qkv_bias).view(n, 3, -1, c // self.num_heads).unbind(1)
        q, k = _rotate(q, *rope), _rotate(k, *rope)  # (N, H, D)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        att = all_pairs(q, k, v)
        x = x + self.out(att.transpose(0, 1).flatten(1)) + self.out_bias
        h = self.fc1(layer_norm(x, self.norm2, self.eps)) + self.fc1_bias
        h = F.gelu(h, approximate="tanh")
        return x + self.fc2(h) + self.fc2_bias


class VisionTower:
    """Patches -> the image's embeddings (h/merge × w/merge, text hidden) in row-major order,
    and one such tensor per deepstack merger."""

    def __init__(self, w: Weights, o: VisionOptions, text_hidden: int) -> None:
        c, p, t = o.hidden, o.patch_size, o.temporal_patch_size
        self.options = o
        kernel = w.tensor("v.patch_embed.weight", (c * 3, t, p, p))  # Ollama's (out·in, T, P, P)
        self.patch = kernel.reshape(c, -1)  # the Conv3d as (C, 3·T·P·P)
        self.patch_bias = w.tensor("v.patch_embed.bias", (c,))
        rows = w.shape("v.pos_embed.weight")[0]
        self.side = int(rows**0.5)
        if self.side * self.side != rows:
            raise ModelLoadError("v.pos_embed.weight's rows are not a square grid")
        grid = w.tensor("v.pos_embed.weight", (rows, c))
        self.pos_grid = grid.T.reshape(1, c, self.side, self.side)
        ffn = w.shape("v.blk.0.mlp.linear_fc1.weight")[0]
        self.blocks = [VisionBlock(w, i, o, ffn) for i in range(o.num_layers)]
        self.merger = Merger(w, "v.merger.", o, text_hidden, postshuffle=False)
        self.deepstack = [
            Merger(w, f"v.deepstack_merger.{i}.", o, text_hidden, postshuffle=True)
            for i in range(len(o.deepstack))
        ]

    def __call__(self, patches: Patches) -> tuple[torch.Tensor, list[torch.Tensor]]:
        o, gh, gw = self.options, patches.height, patches.width
        x = patches.rows @ self.patch.T + self.patch_bias  # (N, C), merge-window order
        x = x + self._positions(gh, gw)
        angles = _angles(gh, gw, o.merge_size, o.head_dim, o.rope_base)
        angles = torch.cat([angles, angles], -1)[:, None]  # (N, 1, D)
        rope = angles.cos(), angles.sin()
        stacked = []
        for i, block in enumerate(self.blocks):
            x = block(x, rope)
            if i in o.deepstack:
                stacked.append(self.deepstack[o.deepstack.index(i)](x))
        return self.merger(x), stacked

    def _positions(self, gh: int, gw: int) -> torch.Tensor:
        """The learned grid resized to the image's (bilinear, corners aligned, as HF's), in
        merge-window order (N, C)."""
        m = self.options.merge_size
        grid = F.interpolate(self.pos_grid, size=(gh, gw), mode="bilinear", align_corners=True)
        grid = grid[0].reshape(-1, gh // m, m, gw // m, m).permute(1, 3, 2, 4, 0)
        return grid.reshape(gh * gw, -1)
