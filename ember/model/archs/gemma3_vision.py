"""Gemma 3 with vision: a SigLIP tower (patch conv, position embeddings, pre-norm encoder with
biases, GELU-tanh MLP, post-norm), a projector (average pool to mm_tokens_per_image, soft-embedding
RMSNorm, projection) and, in the text model, bidirectional attention among an image's tokens.

Weights come from one GGUF (Ollama's: `v.*`, `mm.*` beside the text) or from the text GGUF plus
an mmproj GGUF holding the same names. Image embeddings replace the placeholder rows unscaled.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.archs.gemma3 import Gemma3
from ember.model.archs.gemma3_embed import Gemma3Embedding
from ember.model.base import ImageSpan
from ember.model.config import Config
from ember.model.imageproc import decode_image, to_pixels
from ember.model.registry import register, register_projector
from ember.model.weights import RenamedGGUF, Weights
from ember.nn import rms_norm
from ember.nn.attention import all_pairs

MEAN = STD = (0.5, 0.5, 0.5)
NEWLINES, IMAGE_START, IMAGE_END = "\n\n", "<start_of_image>", "<end_of_image>"


@dataclass(frozen=True, slots=True)
class VisionOptions:
    num_layers: int
    hidden: int
    num_heads: int
    ffn: int
    image_size: int
    patch_size: int
    eps: float
    tokens_per_image: int

    @classmethod
    def from_config(cls, c: Config) -> "VisionOptions":
        """From Ollama's gemma3.vision.* keys, or an mmproj file's clip.vision.* ones."""
        if c.arch == "clip":
            return cls._from_mmproj(c)
        return cls(
            num_layers=c.uint("vision.block_count", maximum=1024),
            hidden=c.uint("vision.embedding_length"),
            num_heads=c.uint("vision.attention.head_count", maximum=4096),
            ffn=c.uint("vision.feed_forward_length"),
            image_size=c.uint("vision.image_size", maximum=8192),
            patch_size=c.uint("vision.patch_size", maximum=1024),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-6),
            tokens_per_image=c.uint("mm.tokens_per_image", c.uint("mm_tokens_per_image", 256)),
        )

    @classmethod
    def _from_mmproj(cls, c: Config) -> "VisionOptions":
        side = c.uint("vision.image_size", maximum=8192) // c.uint(
            "vision.patch_size", maximum=1024
        )
        per_side = side // c.uint("vision.projector.scale_factor", 4, maximum=1024)
        return cls(
            num_layers=c.uint("vision.block_count", maximum=1024),
            hidden=c.uint("vision.embedding_length"),
            num_heads=c.uint("vision.attention.head_count", maximum=4096),
            ffn=c.uint("vision.feed_forward_length"),
            image_size=c.uint("vision.image_size", maximum=8192),
            patch_size=c.uint("vision.patch_size", maximum=1024),
            eps=c.float("vision.attention.layer_norm_epsilon", 1e-6),
            tokens_per_image=max(per_side, 1) ** 2,
        )

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


Affine = tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]  # a projection, its bias


def _norm(w: Weights, name: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return w.tensor(f"{name}.weight", (dim,)), w.tensor(f"{name}.bias", (dim,))


def _affine(w: Weights, name: str, out_dim: int, in_dim: int) -> Affine:
    return w.linear(f"{name}.weight", out_dim, in_dim), w.tensor(f"{name}.bias", (out_dim,))


class VisionBlock:
    def __init__(self, w: Weights, i: int, o: VisionOptions) -> None:
        p, c = f"v.blk.{i}.", o.hidden
        self.ln1, self.ln2 = _norm(w, p + "layer_norm1", c), _norm(w, p + "layer_norm2", c)
        self.qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], [c, c, c], c)
        self.qkv_bias = torch.cat([w.tensor(p + f"attn_{n}.bias", (c,)) for n in "qkv"])
        self.out = _affine(w, p + "attn_output", c, c)
        self.fc1, self.fc2 = (
            _affine(w, p + "mlp.fc1", o.ffn, c),
            _affine(w, p + "mlp.fc2", c, o.ffn),
        )

    def __call__(self, x: torch.Tensor, o: VisionOptions) -> torch.Tensor:
        h = F.layer_norm(x, (o.hidden,), *self.ln1, eps=o.eps)
        qkv = (self.qkv(h) + self.qkv_bias).unflatten(-1, (3, o.num_heads, -1))  # (N, 3, H, D)
        q, k, v = qkv.transpose(0, 2).unbind(1)  # (H, N, D) each
        att = all_pairs(q, k, v)  # SigLIP: every patch sees every patch
        x = x + self.out[0](att.transpose(0, 1).flatten(1)) + self.out[1]
        h = F.layer_norm(x, (o.hidden,), *self.ln2, eps=o.eps)
        h = self.activation(self.fc1[0](h) + self.fc1[1])
        return x + self.fc2[0](h) + self.fc2[1]

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate="tanh")


class VisionTower:
    """Pixels (3, S, S) -> embeddings (tokens_per_image, text hidden)."""

    def __init__(self, w: Weights, o: VisionOptions, text_hidden: int) -> None:
        c, p = o.hidden, o.patch_size
        self.options = o
        self.patch = w.tensor("v.patch_embedding.weight", (c, 3, p, p))
        self.patch_bias = w.tensor("v.patch_embedding.bias", (c,))
        self.position = w.tensor("v.position_embedding.weight", (o.patches_per_side**2, c))
        self.blocks = [VisionBlock(w, i, o) for i in range(o.num_layers)]
        self.post_ln = (
            w.tensor("v.post_layernorm.weight", (c,)),
            w.tensor("v.post_layernorm.bias", (c,)),
        )
        self.soft_emb_norm = w.tensor("mm.mm_soft_emb_norm.weight", (c,))
        self.projection = w.tensor("mm.mm_input_projection.weight", (c, text_hidden))
        side = round(o.tokens_per_image**0.5)
        if side * side != o.tokens_per_image or o.patches_per_side % side:
            raise ValueError("the vision patches do not pool to mm.tokens_per_image")
        self.pool = o.patches_per_side // side

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        o = self.options
        x = F.conv2d(pixels[None], self.patch, self.patch_bias, stride=o.patch_size)  # (1, C, n, n)
        x = x.flatten(2)[0].T + self.position  # (N, C)
        for block in self.blocks:
            x = block(x, o)
        x = F.layer_norm(x, (o.hidden,), *self.post_ln, eps=o.eps)
        grid = x.T.reshape(1, o.hidden, o.patches_per_side, o.patches_per_side)
        pooled = F.avg_pool2d(grid, self.pool, self.pool).flatten(2)[0].T  # (tokens, C)
        return rms_norm(pooled, self.soft_emb_norm, o.eps) @ self.projection


class Gemma3Vision(Gemma3):
    """Gemma 3 whose prompts may hold images (`encode_multimodal`, `image_span`); the tower
    comes from the model's own file or from an mmproj file."""

    def __init__(self, gguf: GGUFFile, config: Config, projector: GGUFFile | None = None) -> None:
        super().__init__(gguf, config)
        if projector is None:
            self.vision_options = VisionOptions.from_config(config)
            weights = Weights(gguf)
        else:
            self.vision_options = VisionOptions.from_config(Config(projector.metadata, "clip"))
            o = self.vision_options
            weights = Weights(MmprojNames(projector, o.ffn, o.hidden))  # type: ignore[arg-type]
        self.vision = VisionTower(weights, self.vision_options, self.options.hidden)
        tokens = list(gguf.metadata.get("tokenizer.ggml.tokens") or [])
        self.image_start = _index(tokens, IMAGE_START) or 255999  # Ollama's fixed ids
        self.image_end = _index(tokens, IMAGE_END) or 256000
        self.newlines = _index(tokens, NEWLINES)
        # every image is resized to one size: its span's length, for the load reservation
        self.longest_image_span = self.vision_options.tokens_per_image + 2 + (
            0 if self.newlines is None else 2)  # fmt: skip

    def preprocess(self, data: bytes) -> torch.Tensor:
        size = self.vision_options.image_size
        return to_pixels(decode_image(data), (size, size), mean=MEAN, std=STD)

    def encode_multimodal(self, data: bytes) -> torch.Tensor:
        """An image's embeddings (tokens_per_image, C), computed once per image."""
        with torch.inference_mode():
            return self.vision(self.preprocess(data))

    def image_span(self, encoded: torch.Tensor) -> ImageSpan:
        """[\\n\\n] <start_of_image> a placeholder per row... <end_of_image> [\\n\\n], as Ollama."""
        nl = [] if self.newlines is None else [self.newlines]
        tokens = [*nl, self.image_start, *[0] * len(encoded), self.image_end, *nl]
        return ImageSpan(tokens, {len(nl) + 1: encoded})

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        images = [t for t in batch.multimodal_data if isinstance(t, torch.Tensor)]
        return self.hidden_with_images(batch, cache, images)

    def hidden_with_images(
        self, batch: Batch, cache: Cache, images: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """As Gemma3.hidden, with batch.multimodal[i] the first row of images[i]'s embeddings,
        whose rows attend to each other both ways."""
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens)) * o.hidden**0.5  # (T, C)
        spans = []
        for start, rows in zip(batch.multimodal, images, strict=True):
            x[start : start + len(rows)] = rows
            spans.append((start, start + len(rows)))
        both_ways(cache, spans)
        return self.layers(x, batch, cache)


class MmprojNames(RenamedGGUF):
    """An mmproj GGUF (llama.cpp's names) seen under Ollama's names, for Weights. Which of
    ffn_up/ffn_down is SigLIP's fc1 is told by shape: converters have written it both ways."""

    def __init__(self, gguf: GGUFFile, ffn: int, hidden: int) -> None:
        names: dict[str, str] = {}
        for name, info in gguf.tensors.items():
            ours = name
            for theirs, mine in _MMPROJ_NAMES:
                ours = re.sub(theirs, mine, ours)
            if ".ffn_" in name:
                is_fc1 = info.shape[0] == ffn and (len(info.shape) == 1 or info.shape[1] == hidden)
                ours = re.sub(r"\.ffn_(up|down)\.", ".mlp.fc1." if is_fc1 else ".mlp.fc2.", name)
            names[ours] = name
        super().__init__(gguf, names)


_MMPROJ_NAMES = (
    (r"^v\.patch_embd\.", "v.patch_embedding."),
    (r"^v\.position_embd\.", "v.position_embedding."),
    (r"^v\.post_ln\.", "v.post_layernorm."),
    (r"\.attn_out\.", ".attn_output."),
    (r"\.ln1\.", ".layer_norm1."),
    (r"\.ln2\.", ".layer_norm2."),
    (r"^mm\.input_projection\.", "mm.mm_input_projection."),
    (r"^mm\.soft_emb_norm\.", "mm.mm_soft_emb_norm."),
)


def _index(tokens: list[str], text: str) -> int | None:
    return tokens.index(text) if text in tokens else None


def both_ways(cache: Cache, spans: list[tuple[int, int]]) -> None:
    """Lets the batch rows of each span see the span's later rows too (the causal masks are
    built by start_forward; only rows of one sequence are ever in a span)."""
    if not spans:
        return
    caches = cache.caches if isinstance(cache, WrapperCache) else [cache]
    for c in caches:
        if isinstance(c, CausalCache):
            for begin, end in spans:
                c.see_both_ways(begin, end)


def build(gguf: GGUFFile, config: Config) -> Gemma3:
    """Gemma3Vision where the file holds a vision tower, EmbeddingGemma where it has a pooling
    type (Ollama's form of it), else the text-only model."""
    if "gemma3.pooling_type" in config.metadata:
        return Gemma3Embedding(gguf, config)
    if "v.patch_embedding.weight" in gguf.tensors:
        return Gemma3Vision(gguf, config)
    return Gemma3(gguf, config)


register("gemma3")(build)
register_projector("gemma3")(Gemma3Vision)
