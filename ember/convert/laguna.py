"""Laguna checkpoints (LagunaForCausalLM) with Ollama's `laguna` keys: per-layer query heads as
an array, `attn_g` the per-head gate, the sliding layers' pattern and RoPE (`rope.swa.*`) apart
from the full layers' (`rope.*`, YaRN's keys where it scales), dense layers as
`dense_layers`, per-expert tensors stacked into `ffn_*_exps`, the shared expert as `*_shexp`, the
router's bias as `exp_probs_b.bias`. Refused: element-wise gating, router logit softcapping, a
router weighting the experts' inputs."""

import math
import re
from typing import Any

from ember.convert.decoder import TextDecoder, expert_pattern
from ember.convert.source import ConvertError, HFConfig

_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.g_proj": "attn_g",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}
_KINDS = ("sliding_attention", "full_attention")


class LagunaDecoder(TextDecoder):
    arch = "laguna"
    layer_names = _NAMES
    expert_names = expert_pattern("mlp.experts")
    router_bias = re.compile(  # HF saves it under `experts`
        r"model\.layers\.(\d+)\.mlp\.(?:experts|gate)\.e_score_correction_bias"
    )

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        if c.get("gating", True) not in (True, "per-head"):
            raise ConvertError("laguna: only per-head attention gating is supported")
        if c.get("moe_router_logit_softcapping") or c.get("moe_apply_router_weight_on_input"):
            raise ConvertError("laguna: router softcapping and input weighting are unsupported")
        n = self.num_layers
        self.heads = c.get("num_attention_heads_per_layer") or [self.num_heads] * n
        self.types = c.get("layer_types") or ["full_attention"] * n
        self.mlp = c.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
        if (len(self.heads), len(self.types), len(self.mlp)) != (n, n, n) or not (
            set(self.types) <= set(_KINDS) and set(self.mlp) <= {"dense", "sparse"}
        ) or not all(isinstance(h, int) and 0 < h <= 4096 for h in self.heads):  # fmt: skip
            raise ConvertError("laguna: per-layer heads, layer_types and mlp_layer_types disagree")
        self.num_experts = c.int("num_experts", maximum=4096)
        self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
        self.expert_ffn = c.int("moe_intermediate_size")
        self.shared_ffn = c.int("shared_expert_intermediate_size")
        params = c.get("rope_parameters")
        if not isinstance(params, dict) or not all(isinstance(params.get(k), dict) for k in _KINDS):
            raise ConvertError("laguna: rope_parameters must give both layer types' RoPE")
        self.ropes = {k: HFConfig(params[k], f"rope {k}") for k in _KINDS}
        local, full = (self.ropes[k].get("rope_type", "default") for k in _KINDS)
        if local != "default" or full not in ("default", "yarn"):
            raise ConvertError("laguna: sliding layers plain RoPE, full ones plain or YaRN only")

    # ------------------------------------------------------------ names and shapes

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, d, f, kv = self.hidden, self.head_dim, self.ffn, self.num_kv_heads * self.head_dim
        e, ef, sf = self.num_experts, self.expert_ffn, self.shared_ffn
        shapes, required = self.top_shapes()
        for i, heads in enumerate(self.heads):
            q = heads * d
            layer = {
                "attn_norm.weight": (c,), "ffn_norm.weight": (c,), "attn_q.weight": (q, c),
                "attn_k.weight": (kv, c), "attn_v.weight": (kv, c), "attn_g.weight": (heads, c),
                "attn_output.weight": (c, q), "attn_q_norm.weight": (d,),
                "attn_k_norm.weight": (d,),
            }  # fmt: skip
            if self.mlp[i] == "dense":
                layer |= {"ffn_gate.weight": (f, c), "ffn_up.weight": (f, c),
                          "ffn_down.weight": (c, f)}  # fmt: skip
            else:
                layer |= {
                    "ffn_gate_inp.weight": (e, c), "exp_probs_b.bias": (e,),
                    "ffn_gate_exps.weight": (e, ef, c), "ffn_up_exps.weight": (e, ef, c),
                    "ffn_down_exps.weight": (e, c, ef), "ffn_gate_shexp.weight": (sf, c),
                    "ffn_up_shexp.weight": (sf, c), "ffn_down_shexp.weight": (c, sf),
                }  # fmt: skip
            named = {f"blk.{i}.{n}": s for n, s in layer.items()}
            shapes |= named
            required |= set(named)
        return shapes, required

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        a, c, d = self.arch, self.text, self.head_dim
        full, local = self.ropes["full_attention"], self.ropes["sliding_attention"]
        meta = super().metadata() | self.expert_metadata(
            self.num_experts, self.num_experts_used, self.expert_ffn
        ) | {
            f"{a}.context_length": c.int("max_position_embeddings", 131072, maximum=1 << 28),
            f"{a}.attention.head_count": self.heads,
            f"{a}.attention.key_length": d,
            f"{a}.attention.value_length": d,
            f"{a}.attention.gating_type": 1,
            f"{a}.attention.qk_norm": True,
            f"{a}.attention.sliding_window": c.int("sliding_window", 512, maximum=1 << 28),
            f"{a}.attention.sliding_window_pattern": [t == "sliding_attention" for t in self.types],
            f"{a}.expert_gating_func": 2,
            f"{a}.expert_weights_norm": True,
            f"{a}.expert_weights_scale": c.float("moe_routed_scaling_factor", 1.0),
            f"{a}.expert_shared_feed_forward_length": self.shared_ffn,
            f"{a}.dense_layers": [i for i, m in enumerate(self.mlp) if m == "dense"],
            f"{a}.rope.dimension_count": _rotated(full, d),
            f"{a}.rope.freq_base": full.float("rope_theta", 500000.0),
            f"{a}.rope.swa.dimension_count": _rotated(local, d),
            f"{a}.rope.swa.freq_base": local.float("rope_theta", 10000.0),
        }
        if full.get("rope_type") == "yarn":
            factor = full.float("factor")
            meta |= {
                f"{a}.rope.scaling.type": "yarn",
                f"{a}.rope.scaling.factor": factor,
                f"{a}.rope.scaling.original_context_length": full.int(
                    "original_max_position_embeddings", maximum=1 << 28
                ),
                f"{a}.rope.scaling.attn_factor": full.float(
                    "attention_factor", 0.1 * math.log(factor) + 1.0
                ),
                f"{a}.rope.scaling.beta_fast": full.float("beta_fast", 32.0),
                f"{a}.rope.scaling.beta_slow": full.float("beta_slow", 1.0),
            }
        return meta


def _rotated(rope: HFConfig, head_dim: int) -> int:
    """The dims RoPE turns: the head's times partial_rotary_factor, as HF's Laguna."""
    return int(head_dim * rope.float("partial_rotary_factor", 1.0))
