"""Llama 3.2 Vision's image side: tiles cut as HF's MllamaImageProcessor cuts them, and the
vision encoder (patch conv, class token, aspect-ratio tile embeddings, gated positions, a local
then a gated global encoder over all tiles at once, intermediate layer outputs concatenated).

Numbers follow HF's MllamaVisionModel: each tile is padded to a multiple of 8 tokens, and only
padding tokens (those and the empty tiles of a small image) are hidden from padding tokens; real
tokens see every token. Ollama has no such mask (its padding attends to all), so its states
differ slightly. The GGUF's intermediate_layers_indices name the INPUT of layer i, as Meta's
reference and Ollama read them (transformers 5 takes the output of layer i instead).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import to_rgb
from ember.model.weights import Weights

# OpenAI CLIP's normalisation, as Llama 3.2 Vision's preprocessor_config.json (and Ollama)
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def aspect_ratios(max_tiles: int) -> list[tuple[int, int]]:
    """Every (rows, columns) arrangement of at most max_tiles tiles; an image's aspect-ratio
    id is its index here plus one (0: no image)."""
    return [
        (a, b)
        for a in range(1, max_tiles + 1)
        for b in range(1, max_tiles + 1)
        if a * b <= max_tiles
    ]


def best_canvas(height: int, width: int, max_tiles: int, tile: int) -> tuple[int, int]:
    """The tiled canvas (height, width) in pixels: the smallest upscale that fits, else the
    largest downscale, the smaller area on a tie (HF's get_optimal_tiled_canvas)."""
    canvases = np.array(aspect_ratios(max_tiles)) * tile
    heights, widths = canvases.T
    scale_h, scale_w = heights / height, widths / width
    scales = np.where(scale_w > scale_h, scale_h, scale_w)
    up = scales[scales >= 1]
    chosen = canvases[scales == (np.min(up) if len(up) else np.max(scales[scales < 1]))]
    best = chosen[np.argmin(chosen[:, 0] * chosen[:, 1])]
    return int(best[0]), int(best[1])


def fit_to_canvas(height: int, width: int, canvas: tuple[int, int], tile: int) -> tuple[int, int]:
    """The resized (height, width): the aspect ratio kept, no side below a tile unless the
    canvas forces it (HF's get_image_size_fit_to_canvas)."""
    target_w = min(max(width, tile), canvas[1])
    target_h = min(max(height, tile), canvas[0])
    scale_h, scale_w = target_h / height, target_w / width
    if scale_w < scale_h:
        return min(math.floor(height * scale_w) or 1, target_h), target_w
    return target_h, min(math.floor(width * scale_h) or 1, target_w)


@dataclass(frozen=True, slots=True)
class Tiles:
    pixels: torch.Tensor  # (tiles, 3, tile, tile) float32, rows of tiles top to bottom
    arrangement: tuple[int, int]  # (rows, columns) of tiles

    @property
    def count(self) -> int:
        return self.arrangement[0] * self.arrangement[1]


def to_tiles(image: Image.Image, tile: int, max_tiles: int) -> Tiles:
    """RGB, resized bilinearly onto its canvas, padded with black at the bottom and right,
    normalised, cut into tiles: HF's MllamaImageProcessor."""
    rgb = to_rgb(image)
    width, height = rgb.size
    canvas = best_canvas(height, width, max_tiles, tile)
    new_h, new_w = fit_to_canvas(height, width, canvas, tile)
    resized = np.asarray(rgb.resize((new_w, new_h), resample=Image.Resampling.BILINEAR))
    padded = np.zeros((canvas[0], canvas[1], 3), np.uint8)
    padded[:new_h, :new_w] = resized
    scaled = (padded.astype(np.float64) * (1 / 255)).astype(np.float32)
    pixels = (scaled - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    rows, cols = canvas[0] // tile, canvas[1] // tile
    tiles = pixels.reshape(rows, tile, cols, tile, 3).transpose(0, 2, 4, 1, 3)
    return Tiles(
        torch.from_numpy(np.ascontiguousarray(tiles.reshape(-1, 3, tile, tile))), (rows, cols)
    )


@dataclass(frozen=True, slots=True)
class VisionOptions:
    num_layers: int
    num_global_layers: int
    hidden: int
    num_heads: int
    ffn: int
    tile_size: int
    patch_size: int
    max_tiles: int
    eps: float
    intermediate: tuple[int, ...]

    @classmethod
    def from_config(cls, c: Config) -> "VisionOptions":
        indices = c.metadata.get(f"{c.arch}.vision.intermediate_layers_indices", [])
        num_layers = c.uint("vision.block_count", maximum=1024)
        if not isinstance(indices, (list, tuple)) or not all(
            isinstance(i, int) and 0 <= i < num_layers for i in indices
        ):
            raise ModelLoadError("mllama.vision.intermediate_layers_indices must index layers")
        o = cls(
            num_layers=num_layers,
            num_global_layers=c.uint("vision.global.block_count", maximum=1024),
            hidden=c.uint("vision.embedding_length"),
            num_heads=c.uint("vision.attention.head_count", maximum=4096),
            ffn=c.uint("vision.feed_forward_length"),
            tile_size=c.uint("vision.image_size", maximum=4096),
            patch_size=c.uint("vision.patch_size", maximum=1024),
            max_tiles=c.uint("vision.max_num_tiles", 4, maximum=64),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-5),
            intermediate=tuple(indices),
        )
        if o.tile_size % o.patch_size or o.hidden % o.num_heads:
            raise ModelLoadError("mllama.vision: the tile must be whole patches, heads whole")
        return o

    @property
    def positions(self) -> int:
        """Tokens of a tile: its patches and the class token."""
        return (self.tile_size // self.patch_size) ** 2 + 1

    @property
    def output_dim(self) -> int:
        return self.hidden * (1 + len(self.intermediate))


class EncoderLayer:
    """Pre-norm attention and GELU MLP, without biases on q/k/v/o; the global encoder's layers
    scale both branches by a gate (stored as tanh(gate), as Ollama's converter writes it)."""

    def __init__(self, w: Weights, prefix: str, o: VisionOptions, *, gated: bool) -> None:
        c, f = o.hidden, o.ffn
        self.attn_norm = (
            w.tensor(prefix + "attn_norm.weight", (c,)),
            w.tensor(prefix + "attn_norm.bias", (c,)),
        )
        self.qkv = w.fused([prefix + f"attn_{n}.weight" for n in "qkv"], [c, c, c], c)
        self.out = w.linear(prefix + "attn_output.weight", c, c)
        self.ffn_norm = (
            w.tensor(prefix + "ffn_norm.weight", (c,)),
            w.tensor(prefix + "ffn_norm.bias", (c,)),
        )
        self.up = w.linear(prefix + "ffn_up.weight", f, c), w.tensor(prefix + "ffn_up.bias", (f,))
        self.down = (
            w.linear(prefix + "ffn_down.weight", c, f),
            w.tensor(prefix + "ffn_down.bias", (c,)),
        )
        self.gates = (
            (w.tensor(prefix + "attn_gate", (1,)), w.tensor(prefix + "ffn_gate", (1,)))
            if gated
            else None
        )

    def __call__(self, x: torch.Tensor, real: torch.Tensor, o: VisionOptions) -> torch.Tensor:
        h = F.layer_norm(x, (o.hidden,), *self.attn_norm, eps=o.eps)
        q, k, v = self.qkv(h).unflatten(-1, (3, o.num_heads, -1)).transpose(0, 2).unbind(1)
        att = _attend(q, k, v, real).transpose(0, 1).flatten(1)
        h = self.out(att)
        x = x + (h * self.gates[0] if self.gates else h)
        h = F.layer_norm(x, (o.hidden,), *self.ffn_norm, eps=o.eps)
        h = self.down[0](F.gelu(self.up[0](h) + self.up[1])) + self.down[1]
        return x + (h * self.gates[1] if self.gates else h)


class VisionEncoder:
    """Tiles (max_tiles, 3, S, S) and their arrangement -> states (max_tiles, positions,
    output_dim): the last global layer's output, then each intermediate layer's input."""

    def __init__(self, w: Weights, o: VisionOptions) -> None:
        c, p, n = o.hidden, o.patch_size, o.positions
        ratios = len(aspect_ratios(o.max_tiles)) + 1
        self.options = o
        self.patch = w.tensor("v.patch_embd.weight", (c, 3, p, p))
        self.class_embd = w.tensor("v.class_embd", (c,))
        self.position = w.tensor("v.position_embd.weight", (n, c))
        self.position_gate = w.tensor("v.position_embd.gate", (1,))  # 1 - tanh(gate)
        self.tile_position = w.tensor("v.tile_position_embd.weight", (ratios, o.max_tiles * n * c))
        self.tile_position_gate = w.tensor("v.tile_position_embd.gate", (1,))  # tanh(gate)
        self.pre_tile = self._tile_embedding(w, "v.pre_tile_position_embd", ratios)
        self.post_tile = self._tile_embedding(w, "v.post_tile_position_embd", ratios)
        self.pre_ln = w.tensor("v.pre_ln.weight", (c,)), w.tensor("v.pre_ln.bias", (c,))
        self.post_ln = w.tensor("v.post_ln.weight", (c,)), w.tensor("v.post_ln.bias", (c,))
        self.layers = [EncoderLayer(w, f"v.blk.{i}.", o, gated=False) for i in range(o.num_layers)]
        self.global_layers = [
            EncoderLayer(w, f"v.global.blk.{i}.", o, gated=True) for i in range(o.num_global_layers)
        ]

    def _tile_embedding(
        self, w: Weights, name: str, ratios: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.options
        return w.tensor(f"{name}.weight", (ratios, o.max_tiles * o.hidden)), w.tensor(
            f"{name}.gate", (1,)
        )

    def _per_tile(self, table: tuple[torch.Tensor, torch.Tensor], ratio_id: int) -> torch.Tensor:
        return (table[0][ratio_id] * table[1]).view(self.options.max_tiles, 1, self.options.hidden)

    def __call__(self, pixels: torch.Tensor, ratio_id: int, num_tiles: int) -> torch.Tensor:
        o = self.options
        tiles, n, c = o.max_tiles, o.positions, o.hidden
        x = (
            F.conv2d(pixels, self.patch, stride=o.patch_size).flatten(2).transpose(1, 2)
        )  # (T, N-1, C)
        x = x + self._per_tile(self.pre_tile, ratio_id)
        x = torch.cat((self.class_embd.expand(tiles, 1, c), x), dim=1)  # (T, N, C)
        x = x + self.position_gate * self.position
        x = x + self.tile_position_gate * self.tile_position[ratio_id].view(tiles, n, c)
        x = F.layer_norm(x, (c,), *self.pre_ln, eps=o.eps)
        padded = -(-n // 8) * 8
        x = F.pad(x, (0, 0, 0, padded - n)).reshape(tiles * padded, c)
        real = _real_tokens(tiles, n, padded, num_tiles)
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in o.intermediate:
                kept[i] = x
            x = layer(x, real, o)
        x = F.layer_norm(x, (c,), *self.post_ln, eps=o.eps)
        x = (x.view(tiles, padded, c) + self._per_tile(self.post_tile, ratio_id)).view(-1, c)
        for layer in self.global_layers:
            x = layer(x, real, o)
        if kept:  # each feature interleaved across the kept layers, as HF's stack(dim=-1)
            x = torch.cat((x, torch.stack([kept[i] for i in o.intermediate], -1).flatten(1)), -1)
        return x.view(tiles, padded, -1)[:, :n]


def _real_tokens(tiles: int, positions: int, padded: int, num_tiles: int) -> torch.Tensor:
    """(L,) bool: the tokens that are neither a tile's padding nor in an empty tile."""
    real = torch.zeros(tiles, padded, dtype=torch.bool)
    real[:num_tiles, :positions] = True
    return real.flatten()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """HF's mask, which hides padding from padding only, without an (L, L) mask: real tokens
    attend to every token, padding tokens to the real ones (two unmasked attentions)."""
    out = torch.empty_like(q)
    out[:, real] = F.scaled_dot_product_attention(q[:, real], k, v)
    pad = ~real
    if bool(pad.any()):
        out[:, pad] = F.scaled_dot_product_attention(q[:, pad], k[:, real], v[:, real])
    return out
