"""Mistral 3 (Mistral Small 3.1): a mistral text model (the llama forward) whose prompts may hold
images read by a Pixtral tower (pixtral.py). An image's span is its rows of [IMG] placeholders,
each row followed by [IMG_BREAK] and the last by [IMG_END], as HF's PixtralProcessor lays it
out; its length follows the image's size.

Weights come from one GGUF (Ollama's `mistral3`: `v.*`, `mm.*` beside the text) or from a text
GGUF (`llama`, as llama.cpp converts Mistral Small 3.1, or `mistral3`) plus llama.cpp's mmproj
(`clip`, projector type `pixtral`)."""

import torch
from PIL import Image

from ember.gguf import GGUFFile
from ember.model.archs.llama import Llama
from ember.model.archs.llama_images import LlamaWithImages
from ember.model.archs.llava_vision import CLIP_MEAN, CLIP_STD, clip_triple
from ember.model.archs.pixtral import LLAMA_CPP_NAMES, OLLAMA_NAMES, PixtralOptions, PixtralTower
from ember.model.base import ImageSpan
from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import decode_image, fit_longest_edge, to_pixels
from ember.model.registry import register, register_projector
from ember.model.weights import Weights

MARKERS = (("[IMG]", 10), ("[IMG_BREAK]", 12), ("[IMG_END]", 13))  # Tekken's ids as fallback


class Mistral3Vision(LlamaWithImages):
    """Mistral with a Pixtral tower (`encode_multimodal`, `image_span`), from the model's own
    file or from an mmproj file."""

    def __init__(self, gguf: GGUFFile, config: Config, projector: GGUFFile | None = None) -> None:
        _check_rope(config)
        super().__init__(gguf, config)
        if projector is None:
            o = self.vision_options = PixtralOptions.from_config(config)
            weights, names = Weights(gguf), OLLAMA_NAMES
            self.mean, self.std = CLIP_MEAN, CLIP_STD
        else:
            clip = Config(projector.metadata, "clip")
            kind = clip.string("projector_type", "pixtral")
            if kind != "pixtral":
                raise ModelLoadError(f"mistral3 takes a pixtral projector, not {kind!r}")
            o = self.vision_options = PixtralOptions.from_config(clip)
            weights, names = Weights(projector), LLAMA_CPP_NAMES
            self.mean = clip_triple(clip, "image_mean", CLIP_MEAN)  # type: ignore[assignment]
            self.std = clip_triple(clip, "image_std", CLIP_STD)  # type: ignore[assignment]
        if o.hidden % o.num_heads or o.head_dim % 4:
            raise ModelLoadError("the vision head size must be a multiple of 4 (2-D RoPE)")
        text = self.options
        self.vision = PixtralTower(weights, o, text.hidden, text.eps, names)
        tokens = list(gguf.metadata.get("tokenizer.ggml.tokens") or [])
        self.image, self.image_break, self.image_end = (
            tokens.index(name) if name in tokens else fallback for name, fallback in MARKERS
        )
        side = (o.longest_edge - 1) // (o.patch_size * o.merge) + 1  # rows and columns at most
        self.longest_image_span = side * (side + 1)  # [IMG] × columns and a break, per row

    def preprocess(self, data: bytes) -> torch.Tensor:
        """PixtralImageProcessor's pixels: fit to longest_edge, sides multiples of a merged
        patch, bicubic (Pillow's, as HF's PIL backend), CLIP normalization."""
        o = self.vision_options
        image = decode_image(data)
        size = fit_longest_edge(*image.size, o.longest_edge, o.patch_size * o.merge)
        return to_pixels(
            image, size, mean=self.mean, std=self.std, resample=Image.Resampling.BICUBIC
        )

    def encode_multimodal(self, data: bytes) -> torch.Tensor:
        """An image's embeddings (rows, columns, C), computed once per image."""
        with torch.inference_mode():
            return self.vision(self.preprocess(data))

    def image_span(self, encoded: torch.Tensor) -> ImageSpan:
        """[IMG] × columns then [IMG_BREAK], per row; [IMG_END] after the last row. Each row's
        embeddings are one piece, placed at its first [IMG]."""
        rows, cols = encoded.shape[:2]
        tokens: list[int] = []
        pieces: dict[int, object] = {}
        for r in range(rows):
            pieces[len(tokens)] = encoded[r]
            tokens += [self.image] * cols + [self.image_end if r == rows - 1 else self.image_break]
        return ImageSpan(tokens, pieces)


def _check_rope(config: Config) -> None:
    scaling = config.string("rope.scaling.type", "")
    if scaling not in ("", "none", "linear"):
        raise ModelLoadError(f"mistral3: RoPE scaling {scaling!r} is not supported")


def build(gguf: GGUFFile, config: Config) -> Llama:
    """Mistral3Vision where the file holds a vision tower, else the text model alone."""
    if "v.patch_conv.weight" in gguf.tensors:
        return Mistral3Vision(gguf, config)
    _check_rope(config)
    return Llama(gguf, config)


register("mistral3")(build)
register_projector("mistral3", "llama", kind="pixtral")(Mistral3Vision)
register_projector("mistral3")(Mistral3Vision)
