"""Gemma 4's vision tower (Gemma4ForConditionalGeneration's `model.vision_tower.*` and
`model.embed_vision.*`) as Ollama's converter writes it: `v.*` and `mm.input_projection`, the
patch projection as a (C, 3, P, P) convolution kernel, the linears' clamp bounds packed into
`v.clamp_data` (layers × 7 linears × 4, then 4 for the projector, zeros where none), and the
`gemma4.vision.*` keys."""

import re
from typing import Any

import torch
from gguf import GGMLQuantizationType

from ember.convert.decoder import Combined
from ember.convert.source import ConvertError, HFConfig

_TOWER = ("model.vision_tower.", "model.embed_vision.")
_TOP = {
    "model.vision_tower.patch_embedder.input_proj.weight": "v.patch_embd.weight",
    "model.vision_tower.patch_embedder.position_embedding_table": "v.position_embd.weight",
    "model.vision_tower.std_bias": "v.std_bias",
    "model.vision_tower.std_scale": "v.std_scale",
    "model.embed_vision.embedding_projection.weight": "mm.input_projection.weight",
}
_LAYER = re.compile(r"model\.vision_tower\.encoder\.layers\.(\d+)\.(.+)")
_LINEARS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
            "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_out",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}  # fmt: skip  (v.clamp_data's order)
_NORMS = {"input_layernorm": "ln1", "post_attention_layernorm": "attn_post_norm",
          "pre_feedforward_layernorm": "ln2", "post_feedforward_layernorm": "ffn_post_norm",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}  # fmt: skip
_BOUNDS = ("input_min", "input_max", "output_min", "output_max")


class Gemma4Tower:
    def __init__(self, v: HFConfig, text_hidden: int) -> None:
        self.layers = v.int("num_hidden_layers", maximum=1024)
        self.hidden = v.int("hidden_size")
        self.ffn = v.int("intermediate_size")
        self.heads = v.int("num_attention_heads", maximum=4096)
        self.head_dim = v.int("head_dim", self.hidden // self.heads, maximum=4096)
        self.patch = v.int("patch_size", 16, maximum=1024)
        self.kernel = v.int("pooling_kernel_size", 3, maximum=64)
        self.positions = v.int("position_embedding_size", 10240, maximum=1 << 20)
        self.eps = v.float("rms_norm_eps", 1e-6)
        self.rope = HFConfig(v.get("rope_parameters") or {}, "vision rope_parameters")
        self.standardize = v.bool("standardize", False)
        self.text_hidden = text_hidden
        if v.int("num_key_value_heads", self.heads, maximum=4096) != self.heads:
            raise ConvertError("gemma4 vision: grouped key/value heads are not supported")
        if v.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ConvertError("gemma4 vision: only the gelu_pytorch_tanh activation is supported")

    @staticmethod
    def owns(hf_name: str) -> bool:
        return hf_name.startswith(_TOWER)

    def rename(self, hf_name: str) -> str:
        if hf_name in _TOP:
            return _TOP[hf_name]
        match = _LAYER.fullmatch(hf_name)
        module, _, kind = (match.group(2) if match else "").rpartition(".")
        if match and kind == "weight" and module in _NORMS:
            return f"v.blk.{match.group(1)}.{_NORMS[module]}.weight"
        if match and module.removesuffix(".linear") in _LINEARS and kind == "weight":
            return f"v.blk.{match.group(1)}.{_LINEARS[module.removesuffix('.linear')]}.weight"
        raise ConvertError(f"unexpected vision tensor {hf_name!r}")

    def split(self, hf_name: str) -> dict[str, Any]:
        name = self.rename(hf_name)
        if name == "v.patch_embd.weight":  # (C, P·P·3) as (row, column, channel) -> (C, 3, P, P)
            c, p = self.hidden, self.patch
            return {name: lambda w: w.reshape(c, p, p, 3).permute(0, 3, 1, 2).contiguous()}
        return {name: lambda w: w}

    def combined(self, hf_names: list[str]) -> dict[str, Combined]:
        """v.clamp_data of the linears' bounds, where the checkpoint has them."""
        prefix = "model.vision_tower.encoder.layers"
        sources = tuple(f"{prefix}.{i}.{module}.{bound}" for i in range(self.layers)
                        for module in _LINEARS for bound in _BOUNDS)  # fmt: skip
        present = set(hf_names)
        if not any(s in present for s in sources):
            return {}
        if missing := [s for s in sources if s not in present]:
            raise ConvertError(f"the checkpoint lacks the clamp bound {missing[0]!r}")
        count = 4 * (len(sources) // 4 + 1)  # the projector's 4: transformers' has none

        def build(values: list[torch.Tensor]) -> torch.Tensor:
            packed = torch.zeros(count)
            packed[: len(values)] = torch.stack([v.float().reshape(()) for v in values])
            return packed.view(torch.uint8)

        return {"v.clamp_data": Combined(sources, (count,), GGMLQuantizationType.F32, build)}

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, f, d, p = self.hidden, self.ffn, self.heads * self.head_dim, self.patch
        shapes: dict[str, tuple[int, ...]] = {
            "v.patch_embd.weight": (c, 3, p, p), "v.position_embd.weight": (2, self.positions, c),
            "mm.input_projection.weight": (self.text_hidden, c),
            "v.clamp_data": (4 * (7 * self.layers + 1),),
        }  # fmt: skip
        if self.standardize:
            shapes |= {"v.std_bias": (c,), "v.std_scale": (c,)}
        per_layer = {"ln1": (c,), "attn_post_norm": (c,), "ln2": (c,), "ffn_post_norm": (c,),
                     "attn_q_norm": (self.head_dim,), "attn_k_norm": (self.head_dim,),
                     "attn_q": (d, c), "attn_k": (d, c), "attn_v": (d, c), "attn_out": (c, d),
                     "ffn_gate": (f, c), "ffn_up": (f, c), "ffn_down": (c, f)}  # fmt: skip
        for i in range(self.layers):
            shapes |= {f"v.blk.{i}.{n}.weight": s for n, s in per_layer.items()}
        return shapes, set(shapes) - {"v.clamp_data"}

    def metadata(self) -> dict[str, Any]:
        a = "gemma4.vision."
        return {
            a + "block_count": self.layers,
            a + "embedding_length": self.hidden,
            a + "attention.head_count": self.heads,
            a + "attention.key_length": self.head_dim,
            a + "feed_forward_length": self.ffn,
            a + "patch_size": self.patch,
            a + "num_channels": 3,
            a + "projector.scale_factor": self.kernel,
            a + "attention.layer_norm_epsilon": self.eps,
            a + "rope.freq_base": self.rope.float("rope_theta", 100.0),
        }
