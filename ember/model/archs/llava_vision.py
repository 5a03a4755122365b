"""Llava: a llama (or qwen2) text model whose prompts may hold images, read by a CLIP vision
tower and a two-layer GELU projector from an mmproj GGUF (llama.cpp's `clip` file, projector
type `mlp`).

The tower: patch conv (no bias), a class token, learned positions, pre-layernorm, pre-norm
encoder blocks with biases (quick-GELU unless clip.use_gelu), every block the file holds (the
converter keeps only those up to vision_feature_layer), the class token dropped. Each patch is
one image token; its embedding replaces the placeholder row, with causal attention as HF's.
"""

import torch
import torch.nn.functional as F

from ember.gguf import GGUFFile
from ember.model.archs.gemma3_vision import MmprojNames, VisionBlock, VisionOptions
from ember.model.archs.llama_images import LlamaWithImages
from ember.model.base import ImageSpan
from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import decode_image, resize_and_crop, to_pixels
from ember.model.registry import register_projector
from ember.model.weights import Weights

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ClipBlock(VisionBlock):
    def __init__(self, w: Weights, i: int, o: VisionOptions, *, exact_gelu: bool) -> None:
        super().__init__(w, i, o)
        self.exact_gelu = exact_gelu

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h) if self.exact_gelu else h * torch.sigmoid(1.702 * h)  # quick GELU


class ClipTower:
    """Pixels (3, S, S) -> embeddings (patches, text hidden)."""

    def __init__(
        self, w: Weights, o: VisionOptions, mm_hidden: int, text_hidden: int, *, exact_gelu: bool
    ) -> None:
        c, p = o.hidden, o.patch_size
        self.options = o
        self.class_embd = w.tensor("v.class_embd", (c,))
        self.patch = w.tensor("v.patch_embedding.weight", (c, 3, p, p))
        self.patch_bias = w.optional("v.patch_embedding.bias", (c,))
        self.position = w.tensor("v.position_embedding.weight", (o.patches_per_side**2 + 1, c))
        self.pre_ln = (w.tensor("v.pre_ln.weight", (c,)), w.tensor("v.pre_ln.bias", (c,)))
        self.blocks = [ClipBlock(w, i, o, exact_gelu=exact_gelu) for i in range(o.num_layers)]
        post = (
            w.optional("v.post_layernorm.weight", (c,)),
            w.optional("v.post_layernorm.bias", (c,)),
        )
        self.post_ln = post if post[0] is not None else None  # llama.cpp applies it when present
        self.mm0 = w.linear("mm.0.weight", mm_hidden, c), w.tensor("mm.0.bias", (mm_hidden,))
        self.mm2 = (
            w.linear("mm.2.weight", text_hidden, mm_hidden),
            w.tensor("mm.2.bias", (text_hidden,)),
        )

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        o = self.options
        x = F.conv2d(pixels[None], self.patch, self.patch_bias, stride=o.patch_size)  # (1, C, n, n)
        x = torch.cat((self.class_embd[None], x.flatten(2)[0].T)) + self.position  # (1 + N, C)
        x = F.layer_norm(x, (o.hidden,), *self.pre_ln, eps=o.eps)
        for block in self.blocks:
            x = block(x, o)
        if self.post_ln is not None:
            x = F.layer_norm(x, (o.hidden,), *self.post_ln, eps=o.eps)  # type: ignore[arg-type]
        h = F.gelu(self.mm0[0](x[1:]) + self.mm0[1])  # patches only: the class token is dropped
        return self.mm2[0](h) + self.mm2[1]


def clip_options(c: Config) -> VisionOptions:
    image_size = c.uint("vision.image_size", maximum=8192)
    patch_size = c.uint("vision.patch_size", maximum=1024)
    if image_size % patch_size:
        raise ModelLoadError("clip.vision.image_size must be a multiple of the patch size")
    return VisionOptions(
        num_layers=c.uint("vision.block_count", maximum=1024),
        hidden=c.uint("vision.embedding_length"),
        num_heads=c.uint("vision.attention.head_count", maximum=4096),
        ffn=c.uint("vision.feed_forward_length"),
        image_size=image_size,
        patch_size=patch_size,
        eps=c.float("vision.attention.layer_norm_epsilon", 1e-5),
        tokens_per_image=(image_size // patch_size) ** 2,
    )


def clip_triple(c: Config, key: str, default: tuple[float, float, float]) -> tuple[float, ...]:
    value = c.metadata.get(f"clip.vision.{key}", default)
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ModelLoadError(f"clip.vision.{key} must list 3 numbers")
    return tuple(float(x) for x in value)


class LlavaVision(LlamaWithImages):
    """Llama plus a CLIP tower from an mmproj file (`encode_multimodal`, `image_span`)."""

    def __init__(self, gguf: GGUFFile, config: Config, projector: GGUFFile) -> None:
        super().__init__(gguf, config)
        clip = Config(projector.metadata, "clip")
        kind = clip.string("projector_type", "mlp")
        if kind != "mlp":
            raise ModelLoadError(f"{config.arch} takes an mlp (llava) projector, not {kind!r}")
        o = self.vision_options = clip_options(clip)
        names = MmprojNames(projector, o.ffn, o.hidden)
        if "mm.0.weight" not in names.tensors:
            raise ModelLoadError("the projector file has no mm.0.weight")
        mm_hidden = names.tensors["mm.0.weight"].shape[0]
        exact_gelu = bool(projector.metadata.get("clip.use_gelu", False))
        weights = Weights(names)  # type: ignore[arg-type]
        self.vision = ClipTower(weights, o, mm_hidden, self.options.hidden, exact_gelu=exact_gelu)
        self.mean = clip_triple(clip, "image_mean", CLIP_MEAN)
        self.std = clip_triple(clip, "image_std", CLIP_STD)

    def preprocess(self, data: bytes) -> torch.Tensor:
        size = self.vision_options.image_size
        image = resize_and_crop(decode_image(data), size)
        return to_pixels(image, (size, size), mean=self.mean, std=self.std)  # type: ignore[arg-type]

    def encode_multimodal(self, data: bytes) -> torch.Tensor:
        """An image's embeddings (patches, C), computed once per image."""
        with torch.inference_mode():
            return self.vision(self.preprocess(data))

    def image_span(self, encoded: torch.Tensor) -> ImageSpan:
        """One placeholder token per patch (HF's expanded <image>); no markers, as llava's."""
        return ImageSpan([0] * len(encoded), {0: encoded})


register_projector("llama")(LlavaVision)


class LlavaQwen2Vision(LlavaVision):
    """Llava with a Qwen2 text model: Qwen2's NeoX RoPE (its q/k/v biases bind when present)."""

    is_neox_rope = True


register_projector("qwen2")(LlavaQwen2Vision)  # qwen2vl/qwen25vl are other archs
