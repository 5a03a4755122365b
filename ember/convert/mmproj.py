"""The llama.cpp convention for a vision model: the text GGUF alone plus an mmproj GGUF
(architecture `clip`, `clip.vision.*` keys, `v.patch_embd`/`v.blk.N.ln1`/`mm.input_projection`
names), written from the same conversion plan as Ollama's single file."""

import re
from typing import Any

from ember.convert.gemma3_vision import Gemma3VisionDecoder

# Ollama's names (the plan's) -> llama.cpp's mmproj names; fc1/fc2 as llama.cpp's gemma3
# converter stores them (ffn_down/ffn_up): a reader tells them apart by shape.
_RENAMES = (
    (r"v\.patch_embedding\.", "v.patch_embd."),
    (r"v\.position_embedding\.", "v.position_embd."),
    (r"v\.post_layernorm\.", "v.post_ln."),
    (r"\.attn_output\.", ".attn_out."),
    (r"\.layer_norm1\.", ".ln1."),
    (r"\.layer_norm2\.", ".ln2."),
    (r"\.mlp\.fc1\.", ".ffn_down."),
    (r"\.mlp\.fc2\.", ".ffn_up."),
    (r"^mm\.mm_input_projection\.", "mm.input_projection."),
    (r"^mm\.mm_soft_emb_norm\.", "mm.soft_emb_norm."),
)


def mmproj_name(name: str) -> str:
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def is_vision_tensor(name: str) -> bool:
    return name.startswith(("v.", "mm."))


def mmproj_metadata(decoder: Gemma3VisionDecoder) -> dict[str, Any]:
    d = decoder
    return {
        "general.type": "mmproj",
        "clip.projector_type": "gemma3",
        "clip.has_vision_encoder": True,
        "clip.use_gelu": True,
        "clip.vision.image_size": d.image_size,
        "clip.vision.patch_size": d.patch_size,
        "clip.vision.embedding_length": d.v_hidden,
        "clip.vision.feed_forward_length": d.v_ffn,
        "clip.vision.projection_dim": d.hidden,
        "clip.vision.block_count": d.v_layers,
        "clip.vision.attention.head_count": d.v_heads,
        "clip.vision.attention.layer_norm_epsilon": d.vision.float("layer_norm_eps", 1e-6),
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
        # patches pooled per side into one token (llama.cpp's default for gemma3 is 4)
        "clip.vision.projector.scale_factor": d.image_size
        // d.patch_size
        // round(d.tokens_per_image**0.5),
    }
