"""DeepSeek V2 and V3 checkpoints (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM) as Ollama's
converter writes them: architecture `deepseek2`, the latent attention's `attn_kv_b` kept whole
(each head's key and value expanded from the latent), per-expert HF tensors stacked into
llama.cpp's `ffn_*_exps`, the shared experts as `ffn_*_shexp`, V3's e_score_correction_bias as
`exp_probs_b.bias`, V3's multi-token-prediction layers left out. V2 routes by a softmax, V3 by
sigmoids (`expert_gating_func` 1 or 2, llama.cpp's key, which Ollama's converter writes too).
GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is V3's model; Ollama writes it as `glm4moelite`, its
`attn_kv_b` split into each head's `attn_k_b` (transposed) and `attn_v_b`, and so does Ember."""

import re
from collections.abc import Callable
from typing import Any

import torch

from ember.convert.decoder import TextDecoder, expert_pattern
from ember.convert.source import ConvertError, HFConfig

_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}
_LAYER = re.compile(r"model\.layers\.(\d+)\..+")
GATING_SOFTMAX, GATING_SIGMOID = 1, 2
Part = Callable[[torch.Tensor], torch.Tensor]


class DeepSeek2Decoder(TextDecoder):
    arch = "deepseek2"
    layer_names = _NAMES
    expert_names = expert_pattern("mlp.experts")
    router_bias = re.compile(r"model\.layers\.(\d+)\.mlp\.gate\.e_score_correction_bias")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.is_v3 = config.get("architectures") != ["DeepseekV2ForCausalLM"]  # sigmoids
        self.q_lora_rank = _optional(c, "q_lora_rank", 0)  # 0: queries from q_proj
        self.kv_lora_rank = c.int("kv_lora_rank")
        self.nope, self.rope_dim = c.int("qk_nope_head_dim"), c.int("qk_rope_head_dim")
        self.value_dim = c.int("v_head_dim")
        self.num_experts = c.int("n_routed_experts", maximum=4096)
        self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
        self.expert_ffn = c.int("moe_intermediate_size")
        self.shared = c.int("n_shared_experts", 1, maximum=64)
        self.leading_dense = self._leading_dense()
        self.groups = _optional(c, "n_group", 1)
        self.groups_used = _optional(c, "topk_group", 1)
        self.rope = c.rope()
        self._check()

    def _leading_dense(self) -> int:
        """The dense layers before the MoE ones: GLM's `mlp_layer_types`, or DeepSeek's count."""
        types = self.text.get("mlp_layer_types")
        if types is None:
            return _optional(self.text, "first_k_dense_replace", 0)
        dense = next((i for i, t in enumerate(types) if t != "dense"), len(types))
        if types != ["dense"] * dense + ["sparse"] * (len(types) - dense) or len(types) != (
                self.num_layers):  # fmt: skip
            raise ConvertError("deepseek2: mlp_layer_types must be dense layers, then sparse")
        return dense

    def _check(self) -> None:
        c = self.text
        if c.get("hidden_act", "silu") != "silu":
            raise ConvertError("deepseek2: only the silu activation is supported")
        if c.get("attention_bias", False) or c.get("moe_layer_freq", 1) != 1:
            raise ConvertError("deepseek2: attention biases or sparse MoE layers are unsupported")
        if self.is_v3 and c.get("rope_interleave") is False:
            raise ConvertError("deepseek2: RoPE over halves (rope_interleave false) is unsupported")
        method = c.get("topk_method") or ("noaux_tc" if self.is_v3 else "greedy")
        if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ConvertError(f"deepseek2: topk_method {method!r} is not supported")
        kind = self.rope.get("rope_type", self.rope.get("type", "default"))
        if kind == "yarn":
            rope = HFConfig(self.rope, "rope")
            if rope.get("mscale") != rope.get("mscale_all_dim"):
                raise ConvertError("deepseek2: YaRN needs mscale equal to mscale_all_dim")
            if rope.float("beta_fast", 32.0) != 32.0 or rope.float("beta_slow", 1.0) != 1.0:
                raise ConvertError("deepseek2: YaRN with beta_fast 32 and beta_slow 1 only")
        elif kind != "default":
            raise ConvertError(f"deepseek2: RoPE scaling {kind!r} is not supported")
        if self.num_experts % self.groups or not 0 < self.groups_used <= self.groups:
            raise ConvertError("deepseek2: n_group must divide the experts, topk_group fit it")

    # ------------------------------------------------------------ names and shapes

    def rename(self, hf_name: str) -> str | None:
        if (m := _LAYER.fullmatch(hf_name)) and int(m.group(1)) >= self.num_layers:
            return None  # V3's multi-token-prediction layer: not a layer of the decoder
        return super().rename(hf_name)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, h, r = self.hidden, self.num_heads, self.kv_lora_rank
        q_out = h * (self.nope + self.rope_dim)
        shapes, required = self.top_shapes()
        if self.q_lora_rank:
            ql = self.q_lora_rank
            query = {"attn_q_a.weight": (ql, c), "attn_q_a_norm.weight": (ql,),
                     "attn_q_b.weight": (q_out, ql)}  # fmt: skip
        else:
            query = {"attn_q.weight": (q_out, c)}
        attention = query | {
            "attn_norm.weight": (c,), "ffn_norm.weight": (c,),
            "attn_kv_a_mqa.weight": (r + self.rope_dim, c), "attn_kv_a_norm.weight": (r,),
            "attn_output.weight": (c, h * self.value_dim),
        } | self.latent_shapes()  # fmt: skip
        for i in range(self.num_layers):
            ffn = self.dense_shapes() if i < self.leading_dense else self.moe_shapes()
            layer = attention | ffn
            named = {f"blk.{i}.{n}": s for n, s in layer.items()}
            shapes |= named
            required |= {n for n in named if not n.endswith("exp_probs_b.bias") or self.is_v3}
        return shapes, required

    def latent_shapes(self) -> dict[str, tuple[int, ...]]:
        """What expands the latent: each head's key and value at once (Ollama's deepseek2)."""
        h, r = self.num_heads, self.kv_lora_rank
        return {"attn_kv_b.weight": (h * (self.nope + self.value_dim), r)}

    def dense_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f = self.hidden, self.ffn
        return {"ffn_gate.weight": (f, c), "ffn_up.weight": (f, c), "ffn_down.weight": (c, f)}

    def moe_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f, e, s = self.hidden, self.expert_ffn, self.num_experts, self.expert_ffn * self.shared
        return {
            "ffn_gate_inp.weight": (e, c), "exp_probs_b.bias": (e,),
            "ffn_gate_exps.weight": (e, f, c), "ffn_up_exps.weight": (e, f, c),
            "ffn_down_exps.weight": (e, c, f),
            "ffn_gate_shexp.weight": (s, c), "ffn_up_shexp.weight": (s, c),
            "ffn_down_shexp.weight": (c, s),
        }  # fmt: skip

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        a, c, rope = self.arch, self.text, HFConfig(self.rope, "rope")
        meta = super().metadata() | self.expert_metadata(
            self.num_experts, self.num_experts_used, self.expert_ffn
        ) | {
            f"{a}.attention.key_length": self.nope + self.rope_dim,
            f"{a}.attention.value_length": self.value_dim,
            f"{a}.attention.kv_lora_rank": self.kv_lora_rank,
            f"{a}.attention.q_lora_rank": self.q_lora_rank,
            f"{a}.rope.dimension_count": self.rope_dim,
            f"{a}.rope.freq_base": rope.float("rope_theta", 10000.0),
            f"{a}.leading_dense_block_count": self.leading_dense,
            f"{a}.expert_shared_count": self.shared,
            f"{a}.expert_gating_func": GATING_SIGMOID if self.is_v3 else GATING_SOFTMAX,
            f"{a}.expert_weights_norm": bool(c.get("norm_topk_prob", False)),
            f"{a}.expert_weights_scale": c.float("routed_scaling_factor", 1.0),
            f"{a}.expert_group_count": self.groups,
            f"{a}.expert_group_used_count": self.groups_used,
        }
        if self.rope.get("rope_type", self.rope.get("type")) == "yarn":
            meta |= {
                f"{a}.rope.scaling.type": "yarn",
                f"{a}.rope.scaling.factor": rope.float("factor"),
                f"{a}.rope.scaling.original_context_length": rope.int(
                    "original_max_position_embeddings", maximum=1 << 28
                ),
                f"{a}.rope.scaling.yarn_log_multiplier": 0.1 * rope.float("mscale_all_dim", 0.0),
            }
        return meta



class Glm4MoeLiteDecoder(DeepSeek2Decoder):
    """GLM-4.7-Flash as Ollama's `glm4moelite`: the absorbed layout, whose per-head dims the
    runtime reads from the tensors (`key_length_mla` and `value_length_mla` as Ollama writes
    them: the cached latent's key and value)."""

    arch = "glm4moelite"

    def split(self, hf_name: str) -> dict[str, Part]:
        parts = super().split(hf_name)
        names = list(parts)
        if len(names) != 1 or not names[0].endswith("attn_kv_b.weight"):
            return parts
        p, h, n = names[0].removesuffix("attn_kv_b.weight"), self.num_heads, self.nope
        return {  # (heads * (nope + value), lora) -> (heads, lora, nope) and (heads, value, lora)
            p + "attn_k_b.weight": lambda t: t.unflatten(0, (h, -1))[:, :n].transpose(1, 2),
            p + "attn_v_b.weight": lambda t: t.unflatten(0, (h, -1))[:, n:],
        }

    def latent_shapes(self) -> dict[str, tuple[int, ...]]:
        h, r = self.num_heads, self.kv_lora_rank
        return {"attn_k_b.weight": (h, r, self.nope), "attn_v_b.weight": (h, self.value_dim, r)}

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        return super().metadata() | {
            f"{a}.attention.key_length_mla": self.kv_lora_rank + self.rope_dim,
            f"{a}.attention.value_length_mla": self.kv_lora_rank,
        }


def _optional(c: HFConfig, key: str, default: int) -> int:
    """An integer that configs may give as null or 0 for `default`."""
    return c.int(key, maximum=1 << 20) if c.get(key) else default
