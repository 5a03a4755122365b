"""Gemma 4's vision (Ollama's `gemma4` file with `v.*` and `mm.*`), as transformers' Gemma4
VisionModel and MultimodalEmbedder compute it.

Pixels: resized (bicubic, aspect kept) to the most patches of `patch_size` within 280 pooled
tokens, sides multiples of patch × pooling kernel, scaled to [-1, 1]. The tower: patches through
a linear patch embedding plus learned x and y position rows, then blocks of RMSNorm, attention
(q and k RMS-normed with weights, v without; 2-D RoPE: the first half of each head turned by the
patch's column, the second by its row; no 1/sqrt(d) scale), post-norms, a GELU-gated MLP; the
linears may clamp their inputs and outputs (Ollama's packed `v.clamp_data`). Then k × k average
pooling, × sqrt(width), optional standardization, a weightless RMSNorm and the projection to the
text model's width.

In the text model an image is <|image>, one pad token per pooled token, <image|>. Where the
checkpoint asks for it (transformers' `use_bidirectional_attention` "vision", Ember's key
`gemma4.vision.bidirectional`), an image's rows also see its later rows on the sliding-window
layers, as transformers' masks have them; otherwise, and in a file without the key (Ollama's),
attention stays causal as transformers' is for the smaller models (Ollama lets every image see
itself both ways on every layer)."""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, WrapperCache
from ember.model.archs.gemma3_vision import both_ways
from ember.model.archs.gemma4 import SLIDING, Gemma4
from ember.model.base import ImageSpan
from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import ImageError, decode_image, to_pixels
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import rms_norm
from ember.nn.attention import all_pairs

MAX_SOFT_TOKENS = 280  # pooled tokens an image may take (transformers' and Ollama's default)
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True, slots=True)
class VisionOptions:
    num_layers: int
    hidden: int
    num_heads: int
    head_dim: int
    patch_size: int
    kernel: int  # the pooling kernel's side
    eps: float
    rope_base: float

    @classmethod
    def from_config(cls, c: Config) -> "VisionOptions":
        hidden = c.uint("vision.embedding_length")
        heads = c.uint("vision.attention.head_count", maximum=4096)
        return cls(
            num_layers=c.uint("vision.block_count", maximum=1024),
            hidden=hidden,
            num_heads=heads,
            head_dim=c.uint("vision.attention.key_length", hidden // heads, maximum=4096),
            patch_size=c.uint("vision.patch_size", 16, maximum=1024),
            kernel=c.uint("vision.projector.scale_factor", 3, maximum=64),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-6),
            rope_base=c.float("vision.rope.freq_base", 100.0),
        )


def target_size(height: int, width: int, o: VisionOptions) -> tuple[int, int]:
    """transformers' get_aspect_ratio_preserving_size: the most patches within the budget."""
    budget = MAX_SOFT_TOKENS * o.kernel**2 * o.patch_size**2
    factor = math.sqrt(budget / (height * width))
    side = o.kernel * o.patch_size
    h, w = math.floor(factor * height / side) * side, math.floor(factor * width / side) * side
    longest = MAX_SOFT_TOKENS * side
    if h == 0 and w == 0:
        raise ImageError("the image cannot be resized to a whole patch")
    if h == 0:
        h, w = side, min(width // height * side, longest)
    elif w == 0:
        h, w = min(height // width * side, longest), side
    return h, w


@dataclass(frozen=True, slots=True)
class Patches:
    rows: torch.Tensor  # (N, 3·P·P), each patch channel-major as Ollama's conv kernel
    height: int  # in patches
    width: int


def preprocess(image: Image.Image, o: VisionOptions) -> Patches:
    p = o.patch_size
    h, w = target_size(image.height, image.width, o)
    pixels = to_pixels(image, (h, w), mean=(0.5,) * 3, std=(0.5,) * 3,
                       resample=Image.Resampling.BICUBIC)  # fmt: skip
    grid = pixels.reshape(3, h // p, p, w // p, p).permute(1, 3, 0, 2, 4)
    return Patches(grid.reshape((h // p) * (w // p), -1).contiguous(), h // p, w // p)


class Clamped:
    """A linear whose input and output may be clamped (transformers' ClippableLinear)."""

    def __init__(self, w: Weights, name: str, out: int, inp: int, bounds: list[float]) -> None:
        self.linear = w.linear(name + ".weight", out, inp)
        self.bounds = bounds  # input min, max, output min, max; [] for none

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.bounds:
            return self.linear(x)
        lo, hi, out_lo, out_hi = self.bounds
        return self.linear(x.clamp(lo, hi)).clamp(out_lo, out_hi)


class VisionBlock:
    def __init__(self, w: Weights, i: int, o: VisionOptions, ffn: int, bounds: list[list[float]]):
        p, c, d = f"v.blk.{i}.", o.hidden, o.num_heads * o.head_dim
        sizes = {"attn_q": (d, c), "attn_k": (d, c), "attn_v": (d, c), "attn_out": (c, d),
                 "ffn_gate": (ffn, c), "ffn_up": (ffn, c), "ffn_down": (c, ffn)}  # fmt: skip
        self.linears = {n: Clamped(w, p + n, *sizes[n], bounds[j]) for j, n in enumerate(LINEARS)}
        norms = ("ln1", "attn_post_norm", "ln2", "ffn_post_norm")
        self.ln1, self.attn_post, self.ln2, self.ffn_post = (
            w.tensor(p + n + ".weight", (c,)) for n in norms
        )
        self.q_norm = w.tensor(p + "attn_q_norm.weight", (o.head_dim,))
        self.k_norm = w.tensor(p + "attn_k_norm.weight", (o.head_dim,))
        self.scale = w.optional(p + "out_scale.weight", (c,))
        self.o = o

    def __call__(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        o, f = self.o, self.linears
        h = rms_norm(x, self.ln1, o.eps)
        heads = (x.shape[0], o.num_heads, o.head_dim)
        q = _rotate(rms_norm(f["attn_q"](h).view(heads), self.q_norm, o.eps), *rope)
        k = _rotate(rms_norm(f["attn_k"](h).view(heads), self.k_norm, o.eps), *rope)
        v = rms_norm(f["attn_v"](h).view(heads), None, o.eps)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        att = all_pairs(q, k, v, scale=1.0).transpose(0, 1).flatten(1)
        x = x + rms_norm(f["attn_out"](att), self.attn_post, o.eps)
        h = rms_norm(x, self.ln2, o.eps)
        h = F.gelu(f["ffn_gate"](h), approximate="tanh") * f["ffn_up"](h)
        x = x + rms_norm(f["ffn_down"](h), self.ffn_post, o.eps)
        return x if self.scale is None else x * self.scale


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each half of the heads (N, H, D) turned NeoX-wise by its own angles (cos, sin (N, 1, D))."""
    parts = []
    for half, c, s in zip(x.chunk(2, -1), cos.chunk(2, -1), sin.chunk(2, -1), strict=True):
        a, b = half.chunk(2, -1)
        parts.append(half * c + torch.cat((-b, a), -1) * s)
    return torch.cat(parts, -1)


class VisionTower:
    """Patches -> the image's embeddings (pooled tokens, text hidden) in row-major order."""

    def __init__(self, w: Weights, o: VisionOptions, text_hidden: int) -> None:
        c, p = o.hidden, o.patch_size
        self.options = o
        self.patch = w.tensor("v.patch_embd.weight", (c, 3, p, p)).reshape(c, -1)
        rows = w.shape("v.position_embd.weight")[1]
        self.positions = w.tensor("v.position_embd.weight", (2, rows, c))
        bounds = _clamps(w, o.num_layers)
        ffn = w.shape("v.blk.0.ffn_gate.weight")[0]
        self.blocks = [VisionBlock(w, i, o, ffn, bounds[7 * i : 7 * i + 7])
                       for i in range(o.num_layers)]  # fmt: skip
        self.std = None
        if w.has("v.std_bias"):
            self.std = w.tensor("v.std_bias", (c,)), w.tensor("v.std_scale", (c,))
        self.projection = Clamped(w, "mm.input_projection", text_hidden, c, bounds[-1])

    def __call__(self, patches: Patches) -> torch.Tensor:
        o, gh, gw, k = self.options, patches.height, patches.width, self.options.kernel
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        xs, ys = xs.flatten(), ys.flatten()
        if max(gh, gw) > self.positions.shape[1]:
            raise ImageError("the image has more patches a side than the tower has positions")
        x = patches.rows @ self.patch.T + self.positions[0][xs] + self.positions[1][ys]
        inv = 1.0 / (o.rope_base ** (torch.arange(0, o.head_dim // 2, 2) / (o.head_dim // 2)))
        fx, fy = xs[:, None] * inv, ys[:, None] * inv
        angles = torch.cat([fx, fx, fy, fy], -1)[:, None]  # (N, 1, D)
        rope = angles.cos(), angles.sin()
        for block in self.blocks:
            x = block(x, rope)
        pooled = x.view(gh // k, k, gw // k, k, -1).mean((1, 3)).flatten(0, 1) * o.hidden**0.5
        if self.std is not None:
            pooled = (pooled - self.std[0]) * self.std[1]
        return self.projection(rms_norm(pooled, None, o.eps))


def _clamps(w: Weights, layers: int) -> list[list[float]]:
    """Each linear's clamp bounds from Ollama's `v.clamp_data` (layers × 7 linears, then the
    projector's, 4 floats each), [] for each where the file has none (all zeros: unset)."""
    count = 7 * layers + 1
    if not w.has("v.clamp_data"):
        return [[] for _ in range(count)]
    data = w.tensor("v.clamp_data", w.shape("v.clamp_data")).flatten()
    if data.numel() != 4 * count:
        raise ModelLoadError(f"v.clamp_data holds {data.numel()} values, not {4 * count}")
    bounds = data.view(count, 4).tolist()
    return [[] if not any(b) else b for b in bounds]


class Gemma4Vision(Gemma4):
    """Gemma 4 whose prompts may hold images."""

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        self.vision_options = VisionOptions.from_config(config)
        self.vision = VisionTower(Weights(gguf), self.vision_options, self.options.hidden)
        tokens = list(gguf.metadata.get("tokenizer.ggml.tokens") or [])
        self.image_start = _index(tokens, "<|image>")
        self.image_end = _index(tokens, "<image|>")
        self.pad = int(gguf.metadata.get("tokenizer.ggml.padding_token_id", 0))
        self.both_ways = config.bool("vision.bidirectional", False)
        self.longest_image_span = MAX_SOFT_TOKENS + 2  # an oblong image's (a square's: 256 + 2)

    def encode_multimodal(self, data: bytes) -> torch.Tensor:
        """An image's embeddings (pooled tokens, C), computed once per image."""
        patches = preprocess(decode_image(data), self.vision_options)
        with torch.inference_mode():
            return self.vision(patches)

    def image_span(self, encoded: torch.Tensor) -> ImageSpan:
        """<|image> a pad token per row... <image|> (each where the vocabulary has it, as
        Ollama): the per-layer embeddings of an image's rows are the pad token's, as
        transformers computes them."""
        start = [] if self.image_start is None else [self.image_start]
        end = [] if self.image_end is None else [self.image_end]
        return ImageSpan([*start, *[self.pad] * len(encoded), *end], {len(start): encoded})

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        tokens = torch.tensor(batch.tokens)
        x = self.token_embd.lookup(tokens) * self.options.hidden**0.5
        spans = []
        for start, rows in zip(batch.multimodal, batch.multimodal_data, strict=True):
            if isinstance(rows, torch.Tensor):
                x[start : start + len(rows)] = rows
                spans.append((start, start + len(rows)))
        if self.both_ways and isinstance(cache, WrapperCache):
            both_ways(cache.caches[SLIDING], spans)
        return self.run(tokens, x, batch, cache)


def _index(tokens: list[str], text: str) -> int | None:
    return tokens.index(text) if text in tokens else None


@register("gemma4")
def build(gguf: GGUFFile, config: Config) -> Gemma4:
    """Gemma4Vision where the file holds a vision tower, else the text model."""
    return Gemma4Vision(gguf, config) if "v.patch_embd.weight" in gguf.tensors else (
        Gemma4(gguf, config))  # fmt: skip
