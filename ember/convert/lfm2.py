"""LFM2 checkpoints (Lfm2ForCausalLM) as llama.cpp writes them: `lfm2`, the convolution layers'
`conv.in_proj` / `conv.conv` / `conv.out_proj` as `shortconv.*` (the depthwise kernel (C, 1, L)
kept as (C, L)), `attention.head_count_kv` an array with 0 on those layers, the final
`embedding_norm` as `token_embd_norm`; the MLP's size as HF adjusts it
(block_auto_adjust_ff_dim). LFM2-MoE (Lfm2MoeForCausalLM) as `lfm2moe`: its per-expert w1/w3/w2
stacked into `ffn_{gate,up,down}_exps`, the router `ffn_gate_inp`, its bias `exp_probs_b.bias`."""

import re
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ember.convert.decoder import TextDecoder, expert_pattern
from ember.convert.source import ConvertError, HFConfig

_NAMES = {
    "operator_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "feed_forward.w1": "ffn_gate",
    "feed_forward.w3": "ffn_up",
    "feed_forward.w2": "ffn_down",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_output",
    "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm",
    "conv.in_proj": "shortconv.in_proj",
    "conv.out_proj": "shortconv.out_proj",
    "conv.conv": "shortconv.conv",
}
_KERNEL = re.compile(r"blk\.\d+\.shortconv\.conv\.weight")


class Lfm2Decoder(TextDecoder):
    arch = "lfm2"
    layer_names = _NAMES

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        types = c.get("layer_types")
        if not isinstance(types, list) or len(types) != self.num_layers or not set(types) <= {
                "conv", "full_attention"}:  # fmt: skip
            raise ConvertError("lfm2: layer_types must say conv or full_attention for each layer")
        self.is_conv = [t == "conv" for t in types]
        self.kernel = c.int("conv_L_cache", 3, maximum=64)
        if c.get("conv_bias", False):
            raise ConvertError("lfm2: convolution biases are not supported")
        if c.get("block_auto_adjust_ff_dim") is True:  # as HF's Lfm2MLP sizes it
            f = int(2 * self.ffn / 3)
            if c.get("block_ffn_dim_multiplier") is not None:
                multiple = c.int("block_multiple_of", 256)
                f = int(c.float("block_ffn_dim_multiplier") * f)
                f = multiple * ((f + multiple - 1) // multiple)
            self.ffn = f
        self.rope = c.rope()
        if self.rope.get("rope_type", self.rope.get("type", "default")) != "default":
            raise ConvertError("lfm2: RoPE scaling is not supported")

    def rename(self, hf_name: str) -> str | None:
        if hf_name == "model.embedding_norm.weight":
            return "token_embd_norm.weight"
        return super().rename(hf_name)

    def split(self, hf_name: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        parts = super().split(hf_name)
        return {n: _squeeze if _KERNEL.fullmatch(n) else f for n, f in parts.items()}

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, d = self.hidden, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        shapes, required = self.top_shapes()
        shapes = {("token_embd_norm.weight" if n == "output_norm.weight" else n): s
                  for n, s in shapes.items()}  # fmt: skip
        required = {("token_embd_norm.weight" if n == "output_norm.weight" else n)
                    for n in required}  # fmt: skip
        for i in range(self.num_layers):
            layer = {"attn_norm.weight": (c,), "ffn_norm.weight": (c,)} | self.mlp_shapes(i)
            if self.is_conv[i]:
                layer |= {"shortconv.in_proj.weight": (3 * c, c),
                          "shortconv.conv.weight": (c, self.kernel),
                          "shortconv.out_proj.weight": (c, c)}  # fmt: skip
            else:
                layer |= {"attn_q.weight": (q, c), "attn_k.weight": (kv, c),
                          "attn_v.weight": (kv, c), "attn_output.weight": (c, q),
                          "attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)}  # fmt: skip
            named = {f"blk.{i}.{n}": s for n, s in layer.items()}
            shapes |= named
            required |= {n for n in named if not n.endswith("exp_probs_b.bias")}  # use_expert_bias
        return shapes, required

    def mlp_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        c, f = self.hidden, self.ffn
        return {"ffn_gate.weight": (f, c), "ffn_up.weight": (f, c), "ffn_down.weight": (c, f)}

    def metadata(self) -> dict[str, Any]:
        a, c, rope = self.arch, self.text, HFConfig(self.rope, "rope")
        return super().metadata() | {
            f"{a}.context_length": c.int("max_position_embeddings", 128000, maximum=1 << 28),
            f"{a}.attention.head_count_kv": [0 if v else self.num_kv_heads for v in self.is_conv],
            f"{a}.attention.layer_norm_rms_epsilon": c.float("norm_eps", 1e-5),
            f"{a}.shortconv.l_cache": self.kernel,
            f"{a}.rope.freq_base": rope.float("rope_theta", 1e6),
        }


class Lfm2MoeDecoder(Lfm2Decoder):
    arch = "lfm2moe"
    layer_names = _NAMES | {"feed_forward.gate": "ffn_gate_inp"}
    expert_names = expert_pattern("feed_forward.experts", "(w1|w2|w3)")
    expert_kinds: ClassVar[dict[str, str]] = {"w1": "gate", "w3": "up", "w2": "down"}
    router_bias = re.compile(r"model\.layers\.(\d+)\.feed_forward\.expert_bias")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.num_experts = c.int("num_experts", maximum=4096)
        self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
        self.expert_ffn = c.int("moe_intermediate_size")
        self.leading_dense = c.int("num_dense_layers", maximum=self.num_layers) if c.get(
            "num_dense_layers") else 0  # fmt: skip

    def mlp_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        if layer < self.leading_dense:
            return super().mlp_shapes(layer)
        c, f, e = self.hidden, self.expert_ffn, self.num_experts
        return {"ffn_gate_inp.weight": (e, c), "exp_probs_b.bias": (e,),
                "ffn_gate_exps.weight": (e, f, c), "ffn_up_exps.weight": (e, f, c),
                "ffn_down_exps.weight": (e, c, f)}  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        return super().metadata() | self.expert_metadata(
            self.num_experts, self.num_experts_used, self.expert_ffn
        ) | {
            f"{a}.leading_dense_block_count": self.leading_dense,
            f"{a}.expert_gating_func": 2,  # sigmoids
            f"{a}.expert_weights_norm": c.get("norm_topk_prob", True) is True,
            f"{a}.expert_weights_scale": c.float("routed_scaling_factor", 1.0),
        }


def _squeeze(kernel: torch.Tensor) -> torch.Tensor:
    return kernel.flatten(1)  # (C, 1, L) -> (C, L)
