"""Qwen 2.5 VL: qwen2's text model with M-RoPE (the rotary frequencies split in sections
rotated by a token's temporal, height and width positions) and images from the windowed ViT of
qwen25vl_vision.py.

An image's span is <|vision_start|>, one placeholder per merged patch, <|vision_end|>. Its rows
take 3-D positions (start, start + row, start + column), and the tokens after it continue from
start + max(rows, columns), as HF's get_rope_index: the runner carries that per-sequence shift
(`position_shift`, Batch.position_offsets), so text positions after an image equal HF's.
Weights: Ollama's one file (`qwen25vl`, `v.*`), or a `qwen2vl` text file plus llama.cpp's mmproj
(`clip`, projector type `qwen2.5vl_merger`).
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.qwen2 import Qwen2
from ember.model.archs.qwen25vl_vision import VisionOptions, VisionTower, preprocess
from ember.model.base import ImageSpan
from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import decode_image
from ember.model.registry import register, register_projector
from ember.model.weights import RenamedGGUF, Weights
from ember.nn import RoPE
from ember.nn.rope import rope_tables

PROJECTOR_TYPES = ("qwen2.5vl_merger", "qwen25vl")
# Ollama's fixed ids, for a vocabulary that does not name the tokens
SPECIALS = {"<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655}


@dataclass(frozen=True, slots=True)
class MRoPE(RoPE):
    """NeoX RoPE whose frequencies come in sections, each turned by one of a token's 3
    positions (temporal, height, width); positions (3, T). Plain positions (T,) (a context
    shift's deltas) turn every section alike."""

    sections: tuple[int, ...] = ()

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return RoPE.cos_sin(self, positions)
        which = torch.repeat_interleave(
            torch.arange(len(self.sections)), torch.tensor(self.sections)
        )
        per_freq = positions.to(torch.float64)[which]  # (dim/2, T)
        angles = per_freq.T / self.scale * self.inv_freq()[None, :]
        return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]


@dataclass(frozen=True, slots=True)
class GridEmbeddings:
    """An encoded image: its embeddings (height × width, C) in row-major order."""

    rows: torch.Tensor
    height: int  # merged patches
    width: int


def _sections(c: Config, rope_dim: int) -> tuple[int, ...]:
    value = c.metadata.get(f"{c.arch}.rope.mrope_section")
    value = value or c.metadata.get(f"{c.arch}.rope.dimension_sections") or [16, 24, 24]
    sections = tuple(int(x) for x in value if int(x) > 0)[:3]
    if sum(sections) != rope_dim // 2:
        raise ModelLoadError(f"the M-RoPE sections {list(sections)} do not cover {rope_dim // 2}")
    return sections


class Qwen2VL(Qwen2):
    """The text model (also alone: a `qwen2vl` file without its projector)."""

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        o, rope = self.options, self.options.rope
        mrope = MRoPE(
            rope.dim, rope.base, True, rope.scale, rope.factors, _sections(config, rope.dim)
        )
        self.options = replace(o, rope=mrope)

    def rope_positions(self, batch: Batch) -> torch.Tensor:
        """(3, T): text tokens at their shifted position thrice; image rows at
        (start, start + row, start + column)."""
        base = torch.tensor(batch.positions)
        if batch.position_offsets:
            base = base + torch.tensor(batch.position_offsets)
        positions = base.expand(3, -1).clone()
        for index, piece in zip(batch.multimodal, batch.multimodal_data, strict=False):
            if isinstance(piece, GridEmbeddings):
                n, start = len(piece.rows), int(base[index])
                r = torch.arange(n)
                span = torch.stack([torch.zeros_like(r), r // piece.width, r % piece.width])
                positions[:, index : index + n] = start + span
        return positions

    def native_rope(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(self.options.rope.cos_sin(self.rope_positions(batch)))


class Qwen25VL(Qwen2VL):
    """Qwen2VL whose prompts may hold images (`encode_multimodal`, `image_span`)."""

    def __init__(self, gguf: GGUFFile, config: Config, projector: GGUFFile | None = None) -> None:
        super().__init__(gguf, config)
        if projector is None:
            self.vision_options = VisionOptions.from_config(config)
            weights = Weights(gguf)
        else:
            clip = Config(projector.metadata, "clip")
            kind = clip.string("projector_type", "")
            if kind not in PROJECTOR_TYPES:
                raise ModelLoadError(f"qwen2vl takes a qwen2.5vl_merger projector, not {kind!r}")
            self.vision_options = VisionOptions.from_config(clip)
            weights = Weights(MmprojNames(projector))  # type: ignore[arg-type]
        self.vision = VisionTower(weights, self.vision_options, self.options.hidden)
        tokens = list(gguf.metadata.get("tokenizer.ggml.tokens") or [])
        ids = {t: tokens.index(t) if t in tokens else i for t, i in SPECIALS.items()}
        self.vision_start = ids["<|vision_start|>"]
        self.vision_end = ids["<|vision_end|>"]
        self.image_pad = ids["<|image_pad|>"]

    def encode_multimodal(self, data: bytes) -> GridEmbeddings:
        """An image's embeddings, computed once per image."""
        patches = preprocess(decode_image(data), self.vision_options)
        m = self.vision_options.merge_size
        with torch.inference_mode():
            return GridEmbeddings(self.vision(patches), patches.height // m, patches.width // m)

    def image_span(self, encoded: GridEmbeddings) -> ImageSpan:
        """<|vision_start|> a placeholder per row... <|vision_end|>."""
        tokens = [self.vision_start, *[self.image_pad] * len(encoded.rows), self.vision_end]
        return ImageSpan(tokens, {1: encoded})

    def position_shift(self, piece: object) -> tuple[int, int]:
        if not isinstance(piece, GridEmbeddings):
            return 0, 0
        rows = len(piece.rows)
        return rows, max(piece.height, piece.width) - rows

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        for index, piece in zip(batch.multimodal, batch.multimodal_data, strict=False):
            if isinstance(piece, GridEmbeddings):
                x[index : index + len(piece.rows)] = piece.rows
        return self.layers(x, batch, cache)


class MmprojNames(RenamedGGUF):
    """llama.cpp's mmproj names seen under Ollama's, for Weights."""

    RENAMES: ClassVar[dict[str, str]] = {"v.patch_embd.weight": "v.patch_embd_0.weight",
               "v.patch_embd.weight.1": "v.patch_embd_1.weight",
               "v.post_ln.weight": "v.merger.ln_q.weight"}  # fmt: skip

    def __init__(self, gguf: GGUFFile) -> None:
        super().__init__(gguf, {self._ours(name): name for name in gguf.tensors})

    def _ours(self, name: str) -> str:
        if name.startswith("mm."):
            return "v.merger.mlp." + name.removeprefix("mm.")
        return self.RENAMES.get(name, name)


def build(gguf: GGUFFile, config: Config) -> Qwen2VL:
    """Qwen25VL where the file holds a vision tower, else the text-only model."""
    if "v.patch_embd_0.weight" in gguf.tensors:
        return Qwen25VL(gguf, config)
    return Qwen2VL(gguf, config)


register("qwen25vl", "qwen2vl")(build)
register_projector("qwen25vl", "qwen2vl")(Qwen25VL)
