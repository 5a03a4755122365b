"""MllamaForConditionalGeneration (Llama 3.2 Vision) checkpoints -> Ollama's single `mllama`
GGUF: the llama text model (`blk.N.cross_attn_*` in its cross-attention layers, gates kept raw),
the vision tower under `v.*` (`v.blk.N` local layers, `v.global.blk.N` gated global ones, the
tile and position embeddings) and the projector as `mm.0`, with Ollama's keys and names.

As Ollama's converter, the vision gates are stored as the model uses them: tanh(gate), and
1 - tanh(gate) for the patch positions (`v.position_embd.gate`, written beside
`v.tile_position_embd.gate` from the one HF gate). The vision q/k rows are not permuted (the
tower has no RoPE)."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ember.convert.llama import LlamaDecoder
from ember.convert.source import ConvertError, HFConfig
from ember.convert.vocab import tokenizer_metadata

_VISION = re.compile(r"(?:model\.)?vision_model\.(.+)")
_PROJECTOR = re.compile(r"(?:model\.)?multi_modal_projector\.(weight|bias)")
_CROSS = re.compile(
    r"(?:model\.language_model|language_model\.model)\.layers\.(\d+)\.(cross_attn.+)"
)
_VISION_LAYER = re.compile(r"(global_)?transformer\.layers\.(\d+)\.(.+)")
_VISION_NAMES = {
    "class_embedding": "v.class_embd",
    "patch_embedding.weight": "v.patch_embd.weight",
    "gated_positional_embedding.embedding": "v.position_embd.weight",
    "gated_positional_embedding.tile_embedding.weight": "v.tile_position_embd.weight",
    "pre_tile_positional_embedding.embedding.weight": "v.pre_tile_position_embd.weight",
    "post_tile_positional_embedding.embedding.weight": "v.post_tile_position_embd.weight",
    "layernorm_pre.weight": "v.pre_ln.weight", "layernorm_pre.bias": "v.pre_ln.bias",
    "layernorm_post.weight": "v.post_ln.weight", "layernorm_post.bias": "v.post_ln.bias",
}  # fmt: skip
_TANH_GATES = {
    "pre_tile_positional_embedding.gate": "v.pre_tile_position_embd.gate",
    "post_tile_positional_embedding.gate": "v.post_tile_position_embd.gate",
}
_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.fc1.weight": "ffn_up.weight", "mlp.fc1.bias": "ffn_up.bias",
    "mlp.fc2.weight": "ffn_down.weight", "mlp.fc2.bias": "ffn_down.bias",
    "input_layernorm.weight": "attn_norm.weight", "input_layernorm.bias": "attn_norm.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_attention_layernorm.bias": "ffn_norm.bias",
}  # fmt: skip
_CROSS_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")


class MllamaDecoder(LlamaDecoder):
    arch = "mllama"

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        if self.is_tied:
            raise ConvertError(
                "mllama: tied embeddings are not supported (the head has fewer rows)"
            )
        layers = self.text.get("cross_attention_layers", [])
        if not isinstance(layers, list) or not all(
            isinstance(i, int) and 0 <= i < self.num_layers for i in layers
        ):
            raise ConvertError("text_config.cross_attention_layers must list layers of the model")
        self.cross_layers = sorted(layers)
        v = self.vision = config.sub("vision_config")
        self.v_hidden, self.v_ffn = v.int("hidden_size", 1280), v.int("intermediate_size", 5120)
        self.v_layers = v.int("num_hidden_layers", 32, maximum=1024)
        self.v_global = v.int("num_global_layers", 8, maximum=1024)
        self.v_heads = v.int("attention_heads", 16, maximum=4096)
        self.tile, self.patch = v.int("image_size", 560), v.int("patch_size", 14)
        self.max_tiles = v.int("max_num_tiles", 4, maximum=64)
        indices = v.get("intermediate_layers_indices", [3, 7, 15, 23, 30])
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and 0 <= i < self.v_layers for i in indices
        ):
            raise ConvertError("vision_config.intermediate_layers_indices must list layers")
        self.intermediate = indices
        if self.tile % self.patch or self.v_hidden % self.v_heads:
            raise ConvertError("vision_config: image_size or heads do not divide evenly")
        if v.int("vision_output_dim", self.v_hidden * (1 + len(indices))) != self.v_hidden * (
            1 + len(indices)
        ):
            raise ConvertError(
                "vision_config.vision_output_dim must be hidden × (1 + intermediate layers)"
            )
        ratios = [[a, b] for a in range(1, self.max_tiles + 1) for b in range(1, self.max_tiles + 1)
                  if a * b <= self.max_tiles]  # fmt: skip
        if v.get("supported_aspect_ratios", ratios) != ratios:
            raise ConvertError("vision_config.supported_aspect_ratios must be every arrangement "
                               "of at most max_num_tiles tiles, in HF's order")  # fmt: skip
        if v.get("hidden_act", "gelu") != "gelu":
            raise ConvertError("vision hidden_act must be gelu")

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config")

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        # the tokenizer's <|image|> follows the text vocabulary, inside the 8 extra embeddings
        return tokenizer_metadata(directory, self.text, vocab_size=self.vocab_size + 8)

    # ------------------------------------------------------------ names

    def split(self, hf_name: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        vision = _VISION.fullmatch(hf_name)
        rest = vision.group(1) if vision else ""
        if rest == "gated_positional_embedding.gate":
            return {"v.position_embd.gate": lambda g: 1 - torch.tanh(g),
                    "v.tile_position_embd.gate": torch.tanh}  # fmt: skip
        if rest in _TANH_GATES:
            return {_TANH_GATES[rest]: torch.tanh}
        layer = _VISION_LAYER.fullmatch(rest) if vision else None
        if layer is not None and layer.group(3) in ("gate_attn", "gate_ffn"):
            name = "attn_gate" if layer.group(3) == "gate_attn" else "ffn_gate"
            return {f"{self._vision_block(layer)}.{name}": torch.tanh}
        return super().split(hf_name)

    def rename(self, hf_name: str) -> str | None:
        projector = _PROJECTOR.fullmatch(hf_name)
        if projector is not None:
            return f"mm.0.{projector.group(1)}"
        cross = _CROSS.fullmatch(hf_name)
        if cross is not None:
            return f"blk.{cross.group(1)}.{cross.group(2).replace('cross_attn.', 'cross_attn_')}"
        vision = _VISION.fullmatch(hf_name)
        if vision is None:
            return super().rename(hf_name)
        rest = vision.group(1)
        if rest in _VISION_NAMES:
            return _VISION_NAMES[rest]
        layer = _VISION_LAYER.fullmatch(rest)
        if layer is not None and layer.group(3) in _LAYER_NAMES:
            return f"{self._vision_block(layer)}.{_LAYER_NAMES[layer.group(3)]}"
        raise ConvertError(f"unexpected tensor {hf_name!r} for mllama")

    def _vision_block(self, layer: re.Match[str]) -> str:
        return f"v.{'global.' if layer.group(1) else ''}blk.{layer.group(2)}"

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.startswith(("v.", "mm.")):
            return tensor
        return super().transform(name, tensor)

    # ------------------------------------------------------------ shapes

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c, d = self.hidden, self.head_dim
        shapes["token_embd.weight"] = (self.vocab_size + 8, c)
        q, kv = self.num_heads * d, self.num_kv_heads * d
        for i in self.cross_layers:
            for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
                shapes.pop(f"blk.{i}.{n}.weight")
                required.discard(f"blk.{i}.{n}.weight")
            p = f"blk.{i}.cross_attn_"
            cross = {p + "q_proj.weight": (q, c), p + "k_proj.weight": (kv, c),
                     p + "v_proj.weight": (kv, c), p + "o_proj.weight": (c, q),
                     p + "q_norm.weight": (d,), p + "k_norm.weight": (d,),
                     p + "attn_gate": (1,), p + "mlp_gate": (1,)}  # fmt: skip
            shapes |= cross
            required |= set(cross)
        vision = self._vision_shapes()
        return shapes | vision, required | set(vision)

    def _vision_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f, p, t = self.v_hidden, self.v_ffn, self.patch, self.max_tiles
        positions = (self.tile // p) ** 2 + 1
        ratios = sum(a * b <= t for a in range(1, t + 1) for b in range(1, t + 1)) + 1
        out: dict[str, tuple[int, ...]] = {
            "v.class_embd": (c,), "v.patch_embd.weight": (c, 3, p, p),
            "v.position_embd.weight": (positions, c), "v.position_embd.gate": (1,),
            "v.tile_position_embd.weight": (ratios, t * positions * c),
            "v.tile_position_embd.gate": (1,),
            "v.pre_tile_position_embd.weight": (ratios, t * c),
            "v.pre_tile_position_embd.gate": (1,),
            "v.post_tile_position_embd.weight": (ratios, t * c),
            "v.post_tile_position_embd.gate": (1,),
            "v.pre_ln.weight": (c,), "v.pre_ln.bias": (c,),
            "v.post_ln.weight": (c,), "v.post_ln.bias": (c,),
            "mm.0.weight": (self.hidden, c * (1 + len(self.intermediate))),
            "mm.0.bias": (self.hidden,),
        }  # fmt: skip
        per_layer = {
            "attn_q.weight": (c, c), "attn_k.weight": (c, c), "attn_v.weight": (c, c),
            "attn_output.weight": (c, c), "ffn_up.weight": (f, c), "ffn_up.bias": (f,),
            "ffn_down.weight": (c, f), "ffn_down.bias": (c,), "attn_norm.weight": (c,),
            "attn_norm.bias": (c,), "ffn_norm.weight": (c,), "ffn_norm.bias": (c,),
        }  # fmt: skip
        blocks = [(f"v.blk.{i}", False) for i in range(self.v_layers)]
        blocks += [(f"v.global.blk.{i}", True) for i in range(self.v_global)]
        for block, gated in blocks:
            out |= {f"{block}.{n}": s for n, s in per_layer.items()}
            if gated:
                out |= {f"{block}.attn_gate": (1,), f"{block}.ffn_gate": (1,)}
        return out

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        v = self.vision
        return super().metadata() | {
            "mllama.attention.cross_attention_layers": self.cross_layers,
            "mllama.vision.block_count": self.v_layers,
            "mllama.vision.global.block_count": self.v_global,
            "mllama.vision.intermediate_layers_indices": self.intermediate,
            "mllama.vision.embedding_length": self.v_hidden,
            "mllama.vision.feed_forward_length": self.v_ffn,
            "mllama.vision.attention.head_count": self.v_heads,
            "mllama.vision.attention.layer_norm_epsilon": v.float("norm_eps", 1e-5),
            "mllama.vision.image_size": self.tile,
            "mllama.vision.patch_size": self.patch,
            "mllama.vision.max_num_tiles": self.max_tiles,
            "mllama.vision.num_channels": v.int("num_channels", 3, maximum=3),
        }
