"""Qwen 2.5 VL's vision side: preprocessing as HF's Qwen2VLImageProcessor (smart resize to
multiples of patch × merge, bicubic, CLIP normalization, patches in merge-window order, each
repeated over the temporal patch) and the windowed ViT (patch conv over the temporal frames,
2-D RoPE, window attention except in the full-attention blocks, RMSNorm, SwiGLU, the patch
merger). Weights under Ollama's names (`v.patch_embd_0`, `v.blk.N.*`, `v.merger.*`)."""

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from PIL import Image

from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import ImageError, to_pixels
from ember.model.weights import Weights
from ember.nn import rms_norm
from ember.nn.attention import all_pairs

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MIN_PIXELS = 56 * 56
MAX_PIXELS = 2 << 20  # Ollama's default bound (HF's real config allows 12.8 M pixels)


@dataclass(frozen=True, slots=True)
class VisionOptions:
    num_layers: int
    hidden: int
    num_heads: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    window_size: int
    full_attention: frozenset[int]  # blocks that see the whole image, not their window
    eps: float
    rope_base: float
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @classmethod
    def from_config(cls, c: Config) -> "VisionOptions":
        """Ollama's qwen25vl.vision.* keys, or an mmproj file's clip.vision.* ones."""
        if c.arch == "clip":
            return cls._from_mmproj(c)
        layers = c.uint("vision.block_count", maximum=1024)
        full = c.metadata.get(f"{c.arch}.vision.fullatt_block_indexes", [7, 15, 23, 31])
        return cls(
            num_layers=layers,
            hidden=c.uint("vision.embedding_length"),
            num_heads=c.uint("vision.attention.head_count", maximum=4096),
            patch_size=c.uint("vision.patch_size", 14, maximum=1024),
            merge_size=c.uint("vision.spatial_merge_size", 2, maximum=64),
            temporal_patch_size=c.uint("vision.temporal_patch_size", 2, maximum=2),
            window_size=c.uint("vision.window_size", 112, maximum=1 << 16),
            full_attention=_indexes(full, layers),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-6),
            rope_base=c.float("vision.rope.freq_base", 10000.0),
            min_pixels=MIN_PIXELS,
            max_pixels=c.uint("vision.max_pixels", MAX_PIXELS, maximum=1 << 28),
        )

    @classmethod
    def _from_mmproj(cls, c: Config) -> "VisionOptions":
        layers = c.uint("vision.block_count", maximum=1024)
        pattern = c.uint("vision.n_wa_pattern", 8, maximum=1024)  # every pattern-th is full
        return cls(
            num_layers=layers,
            hidden=c.uint("vision.embedding_length"),
            num_heads=c.uint("vision.attention.head_count", maximum=4096),
            patch_size=c.uint("vision.patch_size", 14, maximum=1024),
            merge_size=c.uint("vision.spatial_merge_size", 2, maximum=64),
            temporal_patch_size=2,  # llama.cpp's files hold two temporal kernels
            window_size=c.uint("vision.window_size", 112, maximum=1 << 16),
            full_attention=frozenset(i for i in range(layers) if (i + 1) % pattern == 0),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-6),
            rope_base=10000.0,
            min_pixels=MIN_PIXELS,
            max_pixels=c.uint("vision.max_pixels", MAX_PIXELS, maximum=1 << 28),
            mean=_triple(c, "image_mean", CLIP_MEAN),
            std=_triple(c, "image_std", CLIP_STD),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def unit(self) -> int:
        """Patches merged into one image token."""
        return self.merge_size**2


def _indexes(value: object, layers: int) -> frozenset[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise ModelLoadError("vision.fullatt_block_indexes must list block numbers")
    return frozenset(i for i in value if 0 <= i < layers)


def _triple(c: Config, key: str, default: tuple[float, float, float]) -> tuple[float, float, float]:
    value = c.metadata.get(f"clip.vision.{key}", default)
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ModelLoadError(f"clip.vision.{key} must list 3 numbers")
    return float(value[0]), float(value[1]), float(value[2])


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    """HF's smart_resize: sides multiples of factor, area within the bounds, aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError("the image's aspect ratio is over 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


class Sizing(Protocol):
    """What preprocessing reads of a tower's options."""

    @property
    def patch_size(self) -> int: ...
    @property
    def merge_size(self) -> int: ...
    @property
    def temporal_patch_size(self) -> int: ...
    @property
    def min_pixels(self) -> int: ...
    @property
    def max_pixels(self) -> int: ...
    @property
    def mean(self) -> tuple[float, float, float]: ...
    @property
    def std(self) -> tuple[float, float, float]: ...


@dataclass(frozen=True, slots=True)
class Patches:
    """An image as the tower reads it: (N, C·T·P·P) rows in merge-window order, N = h × w."""

    rows: torch.Tensor
    height: int  # in patches
    width: int


def preprocess(image: Image.Image, o: Sizing) -> Patches:
    p, m = o.patch_size, o.merge_size
    h, w = smart_resize(image.height, image.width, p * m, o.min_pixels, o.max_pixels)
    pixels = to_pixels(image, (h, w), mean=o.mean, std=o.std, resample=Image.Resampling.BICUBIC)
    gh, gw = h // p, w // p
    grid = pixels.reshape(3, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
    rows = grid[:, :, :, :, :, None].expand(*grid.shape[:5], o.temporal_patch_size, p, p)
    return Patches(rows.reshape(gh * gw, -1).contiguous(), gh, gw)


class VisionBlock:
    def __init__(self, w: Weights, i: int, o: VisionOptions, ffn: int) -> None:
        p, c = f"v.blk.{i}.", o.hidden
        self.ln1, self.ln2 = w.tensor(p + "ln1.weight", (c,)), w.tensor(p + "ln2.weight", (c,))
        self.qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], [c, c, c], c)
        self.qkv_bias = torch.cat([w.tensor(p + f"attn_{n}.bias", (c,)) for n in "qkv"])
        self.out = w.linear(p + "attn_out.weight", c, c)
        self.out_bias = w.tensor(p + "attn_out.bias", (c,))
        self.gate_up = w.fused([p + "ffn_gate.weight", p + "ffn_up.weight"], [ffn, ffn], c)
        self.gate_up_bias = torch.cat(
            [w.tensor(p + "ffn_gate.bias", (ffn,)), w.tensor(p + "ffn_up.bias", (ffn,))]
        )
        self.down = w.linear(p + "ffn_down.weight", c, ffn)
        self.down_bias = w.tensor(p + "ffn_down.bias", (c,))
        self.ffn, self.eps, self.num_heads = ffn, o.eps, o.num_heads

    def __call__(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], windows: list[int] | None
    ) -> torch.Tensor:
        n, c = x.shape
        h = rms_norm(x, self.ln1, self.eps)
        q, k, v = (self.qkv(h) + self.qkv_bias).view(n, 3, -1, c // self.num_heads).unbind(1)
        q, k = _rotate(q, *rope), _rotate(k, *rope)  # (N, H, D)
        att = _attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), windows)
        x = x + self.out(att.transpose(0, 1).flatten(1)) + self.out_bias
        gate_up = self.gate_up(rms_norm(x, self.ln2, self.eps)) + self.gate_up_bias
        h = F.silu(gate_up[:, : self.ffn]) * gate_up[:, self.ffn :]
        return x + self.down(h) + self.down_bias


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE of x (N, H, D) by cos, sin (N, 1, D)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class VisionTower:
    """Patches -> image embeddings (h/merge × w/merge, text hidden), in row-major order."""

    def __init__(self, w: Weights, o: VisionOptions, text_hidden: int) -> None:
        c, p, unit = o.hidden, o.patch_size, o.unit
        self.options = o
        kernels = [w.tensor(f"v.patch_embd_{t}.weight", (c, 3, p, p)) for t in range(2)]
        self.patch = torch.stack(kernels, 2).reshape(c, -1)  # conv3d as (C, 3·T·P·P)
        ffn = w.shape("v.blk.0.ffn_gate.weight")[0]
        self.blocks = [VisionBlock(w, i, o, ffn) for i in range(o.num_layers)]
        self.ln_q = w.tensor("v.merger.ln_q.weight", (c,))
        self.mlp0 = w.linear("v.merger.mlp.0.weight", c * unit, c * unit)
        self.mlp0_bias = w.tensor("v.merger.mlp.0.bias", (c * unit,))
        self.mlp2 = w.linear("v.merger.mlp.2.weight", text_hidden, c * unit)
        self.mlp2_bias = w.tensor("v.merger.mlp.2.bias", (text_hidden,))

    def __call__(self, patches: Patches) -> torch.Tensor:
        o, unit = self.options, self.options.unit
        x = patches.rows @ self.patch.T  # (N, C)
        order, bounds = window_order(patches.height, patches.width, o)
        x = x.view(-1, unit, o.hidden)[order].flatten(0, 1)
        angles = _angles(patches.height, patches.width, o.merge_size, o.head_dim, o.rope_base)
        angles = angles.view(-1, unit, o.head_dim // 2)
        angles = torch.cat([angles[order].flatten(0, 1)] * 2, -1)[:, None]  # (N, 1, D)
        rope = angles.cos(), angles.sin()
        for i, block in enumerate(self.blocks):
            x = block(x, rope, None if i in o.full_attention else bounds)
        x = rms_norm(x, self.ln_q, o.eps).view(-1, o.hidden * unit)
        x = self.mlp2(F.gelu(self.mlp0(x) + self.mlp0_bias)) + self.mlp2_bias
        return x[torch.argsort(order)]


def _angles(gh: int, gw: int, m: int, head_dim: int, base: float) -> torch.Tensor:
    """Each patch's 2-D RoPE angles (N, head_dim/2): its row's, then its column's, patches in
    merge-window order."""
    dim = head_dim // 2
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")

    def merged(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(gh // m, m, gw // m, m).permute(0, 2, 1, 3).flatten().float()

    return torch.cat([merged(rows)[:, None] * inv, merged(cols)[:, None] * inv], 1)


def window_order(gh: int, gw: int, o: VisionOptions) -> tuple[torch.Tensor, list[int]]:
    """The merged tokens window by window (row-major inside each), and where each window's
    patches end in that order (HF's get_window_index)."""
    lh, lw = gh // o.merge_size, gw // o.merge_size
    side = max(o.window_size // o.merge_size // o.patch_size, 1)
    order: list[int] = []
    bounds = []
    for top in range(0, lh, side):
        for left in range(0, lw, side):
            order += [r * lw + c for r in range(top, min(top + side, lh))
                      for c in range(left, min(left + side, lw))]  # fmt: skip
            bounds.append(len(order) * o.unit)
    return torch.tensor(order), bounds


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int] | None
) -> torch.Tensor:
    """Attention over (H, N, D): among all patches, or only within each window (bounds: where
    each ends). Windows of one size go through one batched call; no N x N mask is built."""
    if bounds is None or len(bounds) == 1:
        return all_pairs(q, k, v)
    starts: dict[int, list[int]] = {}
    for start, end in zip([0, *bounds[:-1]], bounds, strict=True):
        starts.setdefault(end - start, []).append(start)
    out = torch.empty_like(q)
    for size, firsts in starts.items():
        rows = (torch.tensor(firsts)[:, None] + torch.arange(size)).flatten()

        def windows(t: torch.Tensor, rows: torch.Tensor = rows, n: int = len(firsts)):
            return t[:, rows].unflatten(1, (n, -1)).transpose(0, 1)  # (W, H, size, D)

        att = all_pairs(windows(q), windows(k), windows(v))
        out[:, rows] = att.transpose(0, 1).flatten(1, 2)
    return out
