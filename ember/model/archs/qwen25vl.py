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
from ember.model.archs.qwen25vl_vision import Sizing, VisionOptions, VisionTower, preprocess
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
    interleaved: bool = False  # Qwen3-VL's: frequency i turned by t, h, w, t, h, w, ... in turn

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return RoPE.cos_sin(self, positions)
        which = self._section_of_frequency()
        per_freq = positions.to(torch.float64)[which]  # (dim/2, T)
        angles = per_freq.T / self.scale * self.inv_freq()[None, :]
        m = self.magnitude
        return (angles.cos() * m).float()[:, None, :], (angles.sin() * m).float()[:, None, :]

    def _section_of_frequency(self) -> torch.Tensor:
        """Which of the 3 positions turns each frequency (dim/2,): the sections one after
        another, or (interleaved, as HF's apply_interleaved_mrope) h at every third frequency
        from 1 and w from 2 for their sections' lengths, t at the rest."""
        sections = torch.tensor(self.sections)
        if not self.interleaved:
            return torch.repeat_interleave(torch.arange(len(self.sections)), sections)
        which = torch.zeros(int(sections.sum()), dtype=torch.long)
        for axis in (1, 2):
            which[axis : 3 * self.sections[axis] : 3] = axis
        return which


def mrope(
    c: Config, rope: RoPE, *, interleaved: bool = False, default: list[int] | None = None
) -> MRoPE:
    """rope with the file's M-RoPE sections (by default Qwen 2.5 VL's, or Qwen3-VL's)."""
    sections = _sections(c, rope.dim, default or ([24, 20, 20] if interleaved else [16, 24, 24]))
    return MRoPE(rope.dim, rope.base, True, rope.scale, rope.factors, rope.magnitude,
                 sections=sections, interleaved=interleaved)  # fmt: skip


@dataclass(frozen=True, slots=True)
class GridEmbeddings:
    """An encoded image: its embeddings (height × width, C) in row-major order."""

    rows: torch.Tensor
    height: int  # merged patches
    width: int


def _sections(c: Config, rope_dim: int, default: list[int]) -> tuple[int, ...]:
    value = c.metadata.get(f"{c.arch}.rope.mrope_section") or c.metadata.get(
        f"{c.arch}.mrope_sections"
    )  # the key Ollama's qwen3vl reads (its converter writes the first)
    value = value or c.metadata.get(f"{c.arch}.rope.dimension_sections") or default
    sections = tuple(int(x) for x in value if int(x) > 0)[:3]
    if sum(sections) != rope_dim // 2:
        raise ModelLoadError(f"the M-RoPE sections {list(sections)} do not cover {rope_dim // 2}")
    return sections


def grid_positions(batch: Batch) -> torch.Tensor:
    """(3, T) M-RoPE positions: text tokens at their shifted position thrice; image rows at
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


def grid_shift(piece: object) -> tuple[int, int]:
    """PositionShifter's: the tokens after an image go on from its start + its longer side."""
    if not isinstance(piece, GridEmbeddings):
        return 0, 0
    rows = len(piece.rows)
    return rows, max(piece.height, piece.width) - rows


def place_images(x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Embeddings x (T, C) with each image's rows in its placeholders."""
    for index, piece in zip(batch.multimodal, batch.multimodal_data, strict=False):
        if isinstance(piece, GridEmbeddings):
            x[index : index + len(piece.rows)] = piece.rows
    return x


def longest_span(o: Sizing) -> int:
    """The most tokens an image's span can take: smart_resize keeps its area within
    max_pixels, whatever its shape (a square's may be fewer: the load reservation's image)."""
    return o.max_pixels // (o.patch_size * o.merge_size) ** 2 + 2


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """An image's span: <|vision_start|>, one <|image_pad|> per row, <|vision_end|>."""

    start: int
    end: int
    pad: int

    @classmethod
    def of(cls, gguf: GGUFFile) -> "VisionTokens":
        tokens = list(gguf.metadata.get("tokenizer.ggml.tokens") or [])
        ids = {t: tokens.index(t) if t in tokens else i for t, i in SPECIALS.items()}
        return cls(ids["<|vision_start|>"], ids["<|vision_end|>"], ids["<|image_pad|>"])

    def span(self, encoded: GridEmbeddings) -> ImageSpan:
        return ImageSpan([self.start, *[self.pad] * len(encoded.rows), self.end], {1: encoded})


class Qwen2VL(Qwen2):
    """The text model (also alone: a `qwen2vl` file without its projector)."""

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        self.options = replace(self.options, rope=mrope(config, self.options.rope))

    def rope_positions(self, batch: Batch) -> torch.Tensor:
        return grid_positions(batch)

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
        self.vision_tokens = VisionTokens.of(gguf)
        self.longest_image_span = longest_span(self.vision_options)

    def encode_multimodal(self, data: bytes) -> GridEmbeddings:
        """An image's embeddings, computed once per image."""
        patches = preprocess(decode_image(data), self.vision_options)
        m = self.vision_options.merge_size
        with torch.inference_mode():
            return GridEmbeddings(self.vision(patches), patches.height // m, patches.width // m)

    def image_span(self, encoded: GridEmbeddings) -> ImageSpan:
        return self.vision_tokens.span(encoded)

    def position_shift(self, piece: object) -> tuple[int, int]:
        return grid_shift(piece)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        return self.layers(place_images(x, batch), batch, cache)


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
