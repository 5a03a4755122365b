"""Qwen3-VL (`qwen3vl`, `qwen3vlmoe`): Qwen3's (or Qwen3 MoE's) text layers with interleaved
M-RoPE, and images from qwen3vl_vision.py placed as Qwen 2.5 VL places them (3-D positions from
the image's start; the text after it goes on from start + its longer side, as HF's
get_rope_index). Deepstack: the tower's deepstack mergers give one more embedding per image row
and merger, added to the hidden states at the image's rows after text layers 0, 1, ... in turn.

A file without the tower (`v.*`) serves text alone (a text position is the same in each M-RoPE
section, so Qwen3's NeoX RoPE)."""

from dataclasses import dataclass, replace

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.qwen3 import Qwen3, qwen3
from ember.model.archs.qwen3moe import Qwen3Moe
from ember.model.archs.qwen3vl_vision import VisionOptions, VisionTower
from ember.model.archs.qwen25vl import (
    GridEmbeddings,
    VisionTokens,
    grid_positions,
    grid_shift,
    longest_span,
    mrope,
    place_images,
)
from ember.model.archs.qwen25vl_vision import preprocess
from ember.model.base import ImageSpan, Model
from ember.model.config import Config
from ember.model.imageproc import decode_image
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn.rope import rope_tables


@dataclass(frozen=True, slots=True)
class StackedGrid(GridEmbeddings):
    """An encoded image and its deepstack embeddings (one (rows, C) tensor per merger)."""

    deepstack: tuple[torch.Tensor, ...] = ()


class GridVision:
    """The vision side of a Qwen3-VL-style file: its tower, span tokens and image encoding
    (Qwen3-VL's; Qwen3.5's, whose tower has no deepstack mergers)."""

    def __init__(self, gguf: GGUFFile, config: Config, text_hidden: int) -> None:
        self.options = VisionOptions.from_config(config)
        self.tower = VisionTower(Weights(gguf), self.options, text_hidden)
        self.tokens = VisionTokens.of(gguf)
        self.longest_span = longest_span(self.options)

    def encode(self, data: bytes) -> StackedGrid:
        patches = preprocess(decode_image(data), self.options)
        m = self.options.merge_size
        with torch.inference_mode():
            rows, stacked = self.tower(patches)
        return StackedGrid(rows, patches.height // m, patches.width // m, tuple(stacked))


class GridImages:
    """A model's image methods (ImageModel's, PositionShifter's) over its GridVision."""

    images: GridVision

    @property
    def longest_image_span(self) -> int:
        return self.images.longest_span

    def encode_multimodal(self, data: bytes) -> StackedGrid:
        """An image's embeddings, computed once per image."""
        return self.images.encode(data)

    def image_span(self, encoded: StackedGrid) -> ImageSpan:
        return self.images.tokens.span(encoded)

    def position_shift(self, piece: object) -> tuple[int, int]:
        return grid_shift(piece)


class Qwen3VL(GridImages, Qwen3):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        self.options = replace(
            self.options, rope=mrope(config, self.options.rope, interleaved=True)
        )
        self.images = GridVision(gguf, config, self.options.hidden)

    def rope_positions(self, batch: Batch) -> torch.Tensor:
        return grid_positions(batch)

    def native_rope(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(self.options.rope.cos_sin(self.rope_positions(batch)))

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        x = place_images(self.token_embd.lookup(torch.tensor(batch.tokens)), batch)  # (T, C)
        return self.layers(x, batch, cache, deepstack(x, batch))


class Qwen3VLMoe(Qwen3VL, Qwen3Moe):
    """Qwen3-VL's MoE text layers (Qwen3 MoE's) under the same tower."""


def deepstack(x: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
    """What each of the first layers adds (T, C): the batch's images' deepstack rows."""
    added: list[torch.Tensor] = []
    for index, piece in zip(batch.multimodal, batch.multimodal_data, strict=False):
        if not isinstance(piece, StackedGrid):
            continue
        added += [torch.zeros_like(x) for _ in range(len(piece.deepstack) - len(added))]
        for layer, rows in enumerate(piece.deepstack):
            added[layer][index : index + len(rows)] += rows
    return added


def _has_tower(gguf: GGUFFile) -> bool:
    return "v.patch_embed.weight" in gguf.tensors


@register("qwen3vl")
def qwen3vl(gguf: GGUFFile, config: Config) -> Model:
    return Qwen3VL(gguf, config) if _has_tower(gguf) else qwen3(gguf, config)


@register("qwen3vlmoe")
def qwen3vlmoe(gguf: GGUFFile, config: Config) -> Model:
    return Qwen3VLMoe(gguf, config) if _has_tower(gguf) else Qwen3Moe(gguf, config)
