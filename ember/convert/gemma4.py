"""Gemma 4 checkpoints (Gemma4ForCausalLM, and the text model of Gemma4ForConditionalGeneration)
with Ollama's `gemma4` keys and names: the two layer types' head sizes (`key_length` full,
`key_length_swa` sliding) and KV heads (an array where they differ), the sliding pattern, the
shared-KV layers, per-layer embeddings, the experts' fused gate/up stack, and `rope_freqs` for
the full layers' proportional RoPE (1 for the rotated pairs, 1e30 for the rest), as Ollama's
converter writes them. Norm weights are stored as they are (Gemma 4's RMSNorm has no +1).
The vision tower of a multimodal checkpoint goes in as Ollama's converter writes it
(gemma4_vision.py); the audio tower is left out. Refused: bidirectional attention on text, RoPE
other than default (sliding) and proportional or default (full), a proportional factor."""

from pathlib import Path
from typing import Any

import torch

from ember.convert.decoder import Combined
from ember.convert.gemma4_vision import Gemma4Tower
from ember.convert.gemma_text import KINDS, GemmaTextDecoder
from ember.convert.source import ConvertError, HFConfig
from ember.convert.vocab import tokenizer_metadata

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
}


class Gemma4Decoder(GemmaTextDecoder):
    arch = "gemma4"
    layer_tensors = _LAYER
    global_every = 6

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c, n = self.text, self.num_layers
        if c.get("use_bidirectional_attention") not in (None, "vision"):
            raise ConvertError("gemma4: bidirectional attention on text is not supported")
        self.read_layout()
        self.types[-1] = "full_attention"  # as transformers forces it
        self.sliding[-1] = False
        first = n - self.shared
        self.k_eq_v = c.bool("attention_k_eq_v", False)
        dims, self.kv_heads = self._layer_heads()
        full = {d for d, s in zip(dims, self.sliding, strict=True) if not s}
        if len(full) > 1 or any(
            d != self.head_dim for d, s in zip(dims, self.sliding, strict=True) if s
        ):
            raise ConvertError("gemma4: each layer type must have one head size")
        self.global_dim = full.pop() if full else c.int("global_head_dim", 512, maximum=4096)
        wide = c.bool("use_double_wide_mlp", False)
        self.ffns = [self.ffn * (2 if wide and i >= first else 1) for i in range(n)]
        self.per_layer = c.get("hidden_size_per_layer_input") or 0
        self.per_layer_vocab = c.int("vocab_size_per_layer_input", self.vocab_size, maximum=1 << 22)
        self.moe = c.bool("enable_moe_block", False)
        if self.moe:
            self.num_experts = c.int("num_experts", maximum=4096)
            self.num_experts_used = c.int("top_k_experts", maximum=self.num_experts)
            self.expert_ffn = c.int("moe_intermediate_size")
        params = c.get("rope_parameters") or {}
        self.ropes = {k: HFConfig(params.get(k) or {}, f"rope {k}") for k in KINDS}
        local, full = (self.ropes[k].get("rope_type", "default") for k in KINDS)
        if local != "default" or full not in ("default", "proportional"):
            raise ConvertError("gemma4: sliding layers take default RoPE, full ones proportional")
        if self.ropes["full_attention"].float("factor", 1.0) != 1.0:
            raise ConvertError("gemma4: a proportional RoPE factor is not supported")
        vision = config.get("vision_config")
        self.tower = Gemma4Tower(config.sub("vision_config"), self.hidden) if vision else None

    def _layer_heads(self) -> tuple[list[int], list[int]]:
        """Each layer's head size and KV heads: transformers' saved `per_layer_config`, else the
        full layers' `global_head_dim` and, where keys are values, `num_global_key_value_heads`
        (as transformers reads a released config)."""
        c = self.text
        per = c.get("per_layer_config")
        if isinstance(per, dict):
            n = len(self.sliding)
            over = [HFConfig(per.get(str(i)) or {}, "per_layer_config") for i in range(n)]
            return (
                [o.int("head_dim", self.head_dim, maximum=4096) for o in over],
                [o.int("num_key_value_heads", self.num_kv_heads, maximum=4096) for o in over],
            )
        full_dim = c.int("global_head_dim", 512, maximum=4096)
        full_kv = c.int("num_global_key_value_heads", self.num_kv_heads, maximum=4096)
        full_kv = full_kv if self.k_eq_v else self.num_kv_heads
        return (
            [self.head_dim if s else full_dim for s in self.sliding],
            [self.num_kv_heads if s else full_kv for s in self.sliding],
        )

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        """Gemma 4's tokenizer.json (a "▁" BPE with its merges) even beside a tokenizer.model,
        as Ollama's converter reads it."""
        return tokenizer_metadata(directory, self.text, vocab_size=self.vocab_size, spm_bpe=True)

    # ------------------------------------------------------------ names and shapes

    def rename(self, hf_name: str) -> str | None:
        if self.tower is not None and self.tower.owns(hf_name):
            return self.tower.rename(hf_name)
        return super().rename(hf_name)

    def split(self, hf_name: str) -> dict[str, Any]:
        if self.tower is not None and self.tower.owns(hf_name):
            return self.tower.split(hf_name)
        return super().split(hf_name)

    def combined(self, hf_names: list[str]) -> dict[str, Combined]:
        return {} if self.tower is None else self.tower.combined(hf_names)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, p, n = self.hidden, self.per_layer, self.num_layers
        shapes, required = self.top_shapes()
        if self.tower is not None:
            vision, needed = self.tower.shapes()
            shapes, required = shapes | vision, required | needed
        if p:
            top = {"per_layer_token_embd.weight": (self.per_layer_vocab, n * p),
                   "per_layer_model_proj.weight": (n * p, c),
                   "per_layer_proj_norm.weight": (p,)}  # fmt: skip
            shapes |= top
            required |= set(top)
        for i in range(n):
            layer = self._layer_shapes(i)
            named = {f"blk.{i}.{k}": s for k, s in layer.items()}
            shapes |= named
            required |= set(named)
        return shapes, required

    def _layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        c, f = self.hidden, self.ffns[i]
        d = self.head_dim if self.sliding[i] else self.global_dim
        q, kv = self.num_heads * d, self.kv_heads[i] * d
        layer = {
            "attn_norm.weight": (c,), "attn_q.weight": (q, c), "attn_q_norm.weight": (d,),
            "attn_output.weight": (c, q), "post_attention_norm.weight": (c,),
            "ffn_norm.weight": (c,), "ffn_gate.weight": (f, c), "ffn_up.weight": (f, c),
            "ffn_down.weight": (c, f), "post_ffw_norm.weight": (c,),
            "layer_output_scale.weight": (1,),
        }  # fmt: skip
        if i < self.num_layers - self.shared:
            layer |= {"attn_k.weight": (kv, c), "attn_k_norm.weight": (d,)}
            if not (self.k_eq_v and not self.sliding[i]):
                layer["attn_v.weight"] = (kv, c)
        if self.per_layer:
            p = self.per_layer
            layer |= {"inp_gate.weight": (p, c), "proj.weight": (c, p), "post_norm.weight": (c,)}
        if self.moe:
            e, ef = self.num_experts, self.expert_ffn
            layer |= {
                "ffn_gate_inp.weight": (e, c), "ffn_gate_inp.scale": (c,),
                "ffn_down_exps.scale": (e,), "ffn_gate_up_exps.weight": (e, 2 * ef, c),
                "ffn_down_exps.weight": (e, c, ef), "post_ffw_norm_1.weight": (c,),
                "pre_ffw_norm_2.weight": (c,), "post_ffw_norm_2.weight": (c,),
            }  # fmt: skip
        return layer

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        """The full layers' RoPE divisors: 1 for the pairs proportional RoPE turns, 1e30 (no
        turn) for the rest, as Ollama's converter writes them."""
        full = self.ropes["full_attention"]
        factor = full.float("partial_rotary_factor", 1.0)
        if full.get("rope_type", "default") == "default":
            factor = 1.0
        rotated = int(factor * self.global_dim // 2)
        freqs = torch.full((self.global_dim // 2,), 1e30)
        freqs[:rotated] = 1.0
        return {"rope_freqs.weight": freqs}

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        meta = super().metadata() | {
            f"{a}.context_length": c.int("max_position_embeddings", 131072, maximum=1 << 28),
            f"{a}.feed_forward_length": _one_or_each(self.ffns),
            f"{a}.attention.head_count_kv": _one_or_each(self.kv_heads),
            f"{a}.attention.key_length": self.global_dim,
            f"{a}.attention.value_length": self.global_dim,
            f"{a}.attention.key_length_swa": self.head_dim,
            f"{a}.attention.value_length_swa": self.head_dim,
            f"{a}.attention.sliding_window": c.int("sliding_window", 512, maximum=1 << 28),
            f"{a}.attention.sliding_window_pattern": self.sliding,
            f"{a}.attention.shared_kv_layers": self.shared,
            f"{a}.rope.freq_base": self.ropes["full_attention"].float("rope_theta", 1e6),
            f"{a}.rope.dimension_count": self.global_dim,
            f"{a}.rope.freq_base_swa": self.ropes["sliding_attention"].float("rope_theta", 1e4),
            f"{a}.rope.dimension_count_swa": self.head_dim,
            f"{a}.embedding_length_per_layer_input": self.per_layer,
        }
        if cap := c.get("final_logit_softcapping"):
            meta[f"{a}.final_logit_softcapping"] = float(cap)
        if self.moe:
            meta |= self.expert_metadata(self.num_experts, self.num_experts_used, self.expert_ffn)
        if self.tower is None:
            return meta
        both_ways = c.get("use_bidirectional_attention") == "vision"
        return meta | self.tower.metadata() | {f"{a}.vision.bidirectional": both_ways}


def _one_or_each(counts: list[int]) -> int | list[int]:
    """A count per layer as Ollama's converter writes it: one value where all layers agree."""
    return counts[0] if len(set(counts)) == 1 else counts
