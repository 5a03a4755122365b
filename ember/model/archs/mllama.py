"""Llama 3.2 Vision (`mllama`): a llama text model whose cross_attention_layers attend, through
tanh-gated attention and MLP, to the projected vision states of the sequence's image, kept per
sequence in the encoder cache. One image per request, as Ollama: its span is the single
<|image|> token, whose input carries the states. A row sees the image from the image's position
on; rows before it, and sequences with no image, skip the cross-attention layers (HF's
text-only path; Meta's reference zeroes such rows).

The file is Ollama's single GGUF: the text `blk.N.*` (cross layers with `cross_attn_*`), the
tower under `v.*` (mllama_vision.py) and the projector `mm.0`.
"""

from typing import Any

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, EncoderCache, WrapperCache
from ember.model.archs.llama import Block, LlamaOptions, _rows
from ember.model.archs.mllama_vision import VisionEncoder, VisionOptions, aspect_ratios, to_tiles
from ember.model.base import ImageSpan
from ember.model.config import Config, ModelLoadError
from ember.model.imageproc import decode_image
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import rms_norm

IMAGE_TOKEN = "<|image|>"
IMAGE_TOKEN_ID = 128256  # Ollama's fixed id, for a vocabulary without the token


class CrossBlock:
    """A cross-attention decoder layer: gated attention over image states, then a gated MLP."""

    def __init__(self, w: Weights, i: int, o: LlamaOptions) -> None:
        p, c, d = f"blk.{i}.", o.hidden, o.head_dim
        q_out, kv_out = o.num_heads * d, o.num_kv_heads * d
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.q = w.linear(p + "cross_attn_q_proj.weight", q_out, c)
        self.kv = w.fused(
            [p + "cross_attn_k_proj.weight", p + "cross_attn_v_proj.weight"], [kv_out, kv_out], c
        )
        self.o = w.linear(p + "cross_attn_o_proj.weight", c, q_out)
        self.q_norm = w.tensor(p + "cross_attn_q_norm.weight", (d,))
        self.k_norm = w.tensor(p + "cross_attn_k_norm.weight", (d,))
        self.attn_gate = torch.tanh(w.tensor(p + "cross_attn_attn_gate", (1,)))
        self.mlp_gate = torch.tanh(w.tensor(p + "cross_attn_mlp_gate", (1,)))
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        self.ffn_gate_up = w.fused([p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], c)
        self.ffn_down = w.linear(p + "ffn_down.weight", c, o.ffn)

    def image_kv(self, states: torch.Tensor, o: LlamaOptions) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k-normed) and values (T_enc, H_kv, D) of an image's projected states."""
        kv = self.kv(states).view(len(states), 2, o.num_kv_heads, o.head_dim)
        return rms_norm(kv[:, 0], self.k_norm, o.eps), kv[:, 1]

    def __call__(
        self,
        x: torch.Tensor,
        images: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        o: LlamaOptions,
    ) -> torch.Tensor:
        """x (T, C); images: (rows of x, keys, values (H_kv, T_enc, D)) per sequence."""
        x = x.clone()
        for rows, keys, values in images:
            h = x[rows]
            q = self.q(rms_norm(h, self.attn_norm, o.eps)).view(len(rows), o.num_heads, o.head_dim)
            q = rms_norm(q, self.q_norm, o.eps).transpose(0, 1)  # (H, n, D)
            att = F.scaled_dot_product_attention(
                q, keys, values, enable_gqa=o.num_heads != o.num_kv_heads
            )
            h = h + self.attn_gate * self.o(att.transpose(0, 1).flatten(1))
            gate_up = self.ffn_gate_up(rms_norm(h, self.ffn_norm, o.eps))
            ffn = self.ffn_down(F.silu(gate_up[:, : o.ffn]) * gate_up[:, o.ffn :])
            x[rows] = h + self.mlp_gate * ffn
        return x


def _int_list(c: Config, key: str) -> list[int]:
    value = c.metadata.get(f"{c.arch}.{key}", [])
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) for i in value):
        raise ModelLoadError(f"{c.arch}.{key} must list layer numbers")
    return list(value)


class Mllama:
    """Text model with cross-attention layers, a vision encoder and its projector."""

    max_images = 1  # per request, as Ollama (its encoder cache holds one image a sequence)

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = LlamaOptions.from_config(config, w, is_neox=False)
        self.cross_layers = set(_int_list(config, "attention.cross_attention_layers"))
        if not self.cross_layers <= set(range(o.num_layers)):
            raise ModelLoadError("mllama.attention.cross_attention_layers names a missing layer")
        if "output.weight" not in gguf.tensors:
            raise ModelLoadError(
                "an mllama file needs output.weight (its embeddings have more rows)"
            )
        self.vocab_size = gguf.tensors["output.weight"].shape[0]  # the embeddings add 8 rows
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", w.vocab_size(), o.hidden)
        self.blocks: list[Any] = [
            CrossBlock(w, i, o) if i in self.cross_layers else Block(w, i, o)
            for i in range(o.num_layers)
        ]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.linear("output.weight", self.vocab_size, o.hidden)
        v = self.vision_options = VisionOptions.from_config(config)
        self.vision = VisionEncoder(w, v)
        self.projector = (
            w.linear("mm.0.weight", o.hidden, v.output_dim),
            w.tensor("mm.0.bias", (o.hidden,)),
        )
        tokens = list(gguf.metadata.get("tokenizer.ggml.tokens") or [])
        self.image_token = tokens.index(IMAGE_TOKEN) if IMAGE_TOKEN in tokens else IMAGE_TOKEN_ID
        self.longest_image_span = 1  # one token, whatever the image: the tower need not run at load

    def make_cache(self) -> Cache:
        o, v = self.options, self.vision_options
        kinds = [0 if i in self.cross_layers else 1 for i in range(o.num_layers)]
        # an image's keys and values, at most: every tile, each cross layer, float32
        image = v.max_tiles * v.positions * len(self.cross_layers) * 2 * o.num_kv_heads * o.head_dim
        encoder = EncoderCache(bytes_per_image=image * 4)
        return WrapperCache([encoder, CausalCache(shift=self.shift)], kinds)

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)

    # ---------------------------------------------------------------- images

    def encode_multimodal(self, data: bytes) -> torch.Tensor:
        """The projected states (tiles × positions, C) of the image's tiles; its empty tiles
        are encoded (they shape the real ones) but not kept: no row attends to them."""
        v = self.vision_options
        tiles = to_tiles(decode_image(data), v.tile_size, v.max_tiles)
        ratio_id = aspect_ratios(v.max_tiles).index(tiles.arrangement) + 1
        pixels = torch.zeros(v.max_tiles, 3, v.tile_size, v.tile_size)
        pixels[: tiles.count] = tiles.pixels
        with torch.inference_mode():
            states = self.vision(pixels, ratio_id, tiles.count)[: tiles.count].flatten(0, 1)
            return self.projector[0](states) + self.projector[1]

    def image_span(self, encoded: torch.Tensor) -> ImageSpan:
        """The single <|image|> token, carrying the states (as Ollama's PostTokenize)."""
        return ImageSpan([self.image_token], {0: encoded})

    # ---------------------------------------------------------------- text

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens))
        encoder = _encoder(cache)
        groups = [(o.num_heads, o.head_dim**-0.5), (o.num_kv_heads, 1.0)]
        rot = o.rope.rotation(torch.tensor(batch.positions), o.head_dim, groups)
        outputs = _rows(batch)
        images = _image_rows(batch, encoder)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            if isinstance(block, CrossBlock):
                if images:
                    x = block(x, self._image_kv(block, batch, encoder, images), o)
                continue
            last = i == o.num_layers - 1
            x = block(x, rot, cache, o, outputs if last else None)
        if isinstance(self.blocks[-1], CrossBlock) and outputs is not None:
            x = x[outputs]
        return rms_norm(x, self.output_norm, o.eps)

    def _image_kv(
        self,
        block: CrossBlock,
        batch: Batch,
        encoder: EncoderCache,
        images: dict[int, torch.Tensor],
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per sequence that sees an image: its rows, the image's keys and values (stored
        first when this batch carries the image)."""
        out = []
        for seq, rows in images.items():
            row = encoder.image_row(seq)
            if row is not None:
                data = batch.multimodal_data[batch.multimodal.index(row)]
                if not isinstance(data, torch.Tensor):
                    raise ValueError("an mllama image input carries no vision states")
                encoder.store(seq, *block.image_kv(data, self.options))
            out.append((rows, *encoder.lookup(seq)))
        return out


def _encoder(cache: Cache) -> EncoderCache:
    caches = cache.caches if isinstance(cache, WrapperCache) else [cache]
    found = [c for c in caches if isinstance(c, EncoderCache)]
    if not found:
        raise ValueError("mllama needs its own cache (make_cache): it has no encoder cache")
    return found[0]


def _image_rows(batch: Batch, encoder: EncoderCache) -> dict[int, torch.Tensor]:
    """Per sequence with an image: the batch rows at or after the image's position."""
    rows: dict[int, list[int]] = {}
    for i, (seq, pos) in enumerate(zip(batch.sequences, batch.positions, strict=True)):
        image = encoder.image_position(seq)
        if image is not None and pos >= image:
            rows.setdefault(seq, []).append(i)
    return {seq: torch.tensor(r) for seq, r in rows.items()}


register("mllama")(Mllama)
