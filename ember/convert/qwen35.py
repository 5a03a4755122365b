"""Qwen3.5 checkpoints (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, and the text models of their
ForConditionalGeneration) with Ollama's `qwen35` / `qwen35moe` keys and names: the DeltaNet
layers' `ssm.*` sizes, `attention.head_count_kv` 0 on them, norm weights with Qwen's +1 added
(not `ssm_norm`), `ssm_a` as -exp(A_log), the convolution as (channels, kernel), the experts'
fused gate/up split in two, and the value heads of the DeltaNet tensors reordered from grouped by
key head to tiled over them (`ssm.v_head_reordered`), as Ollama's converter writes them. The
vision tower and the multi-token-prediction layers are left out."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ember.convert.decoder import TextDecoder, expert_pattern
from ember.convert.qwen3vl_tower import Qwen3VLTower
from ember.convert.source import ConvertError, HFConfig

_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_GATE_UP = "mlp.experts.gate_up_proj"
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")
_LEFT_OUT = ("model.visual.", "mtp.")  # the tower where the decoder has none


class Qwen35Decoder(TextDecoder):
    arch = "qwen35"
    expert_names = expert_pattern("mlp.experts")  # as transformers saves them, one by one

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c, n = self.text, self.num_layers
        interval = c.int("full_attention_interval", 4, maximum=n)
        self.types = c.get("layer_types") or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
        if len(self.types) != n or set(self.types) != {"full_attention", "linear_attention"}:
            raise ConvertError("qwen3.5: layer_types must mix linear_attention and full_attention")
        self.key_heads = c.int("linear_num_key_heads", maximum=4096)
        self.value_heads = c.int("linear_num_value_heads", maximum=4096)
        self.key_dim = c.int("linear_key_head_dim", maximum=4096)
        self.value_dim = c.int("linear_value_head_dim", maximum=4096)
        self.kernel = c.int("linear_conv_kernel_dim", 4, maximum=64)
        if self.value_heads % self.key_heads:
            raise ConvertError("qwen3.5: linear_num_value_heads must divide by its key heads")
        self.rope = HFConfig(c.get("rope_parameters") or {}, "rope_parameters")
        if self.rope.get("rope_type", "default") != "default":
            raise ConvertError("qwen3.5: only default (M-)RoPE is supported")
        self.num_experts = c.int("num_experts", maximum=4096) if self.arch != "qwen35" else 0
        if self.num_experts:
            self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
            self.expert_ffn = c.int("moe_intermediate_size")
            self.shared_ffn = c.int("shared_expert_intermediate_size")
        vision = config.get("vision_config")
        # Qwen3_5ForConditionalGeneration's tower, as Ollama's qwen35 files hold it
        self.tower = Qwen3VLTower(config.sub("vision_config"), self.hidden) if vision else None

    def text_config(self, config: HFConfig) -> HFConfig:
        text = config.sub("text_config") if "text_config" in config.values else config
        if text.get("intermediate_size") is None:  # a mixture's config (no dense MLP) has none
            return HFConfig({**text.values, "intermediate_size": text.get("moe_intermediate_size")})
        return text

    # ------------------------------------------------------------ names and shapes

    def rename(self, hf_name: str) -> str | None:
        if self.tower is not None and (name := self.tower.rename(hf_name)):
            return name
        if hf_name.startswith("model.language_model."):
            hf_name = "model." + hf_name.removeprefix("model.language_model.")
        if hf_name.startswith(_LEFT_OUT) or (hf_name == "lm_head.weight" and self.is_tied):
            return None
        if hf_name in _TOP:
            return _TOP[hf_name]
        match = _LAYER_NAME.fullmatch(hf_name)
        if match is None or match.group(2) not in _LAYER:
            raise ConvertError(f"unexpected tensor {hf_name!r} for {self.arch}")
        return f"blk.{match.group(1)}.{_LAYER[match.group(2)]}"

    def stacked(self, hf_name: str) -> tuple[str, int] | None:
        return super().stacked(hf_name.replace("model.language_model.", "model."))

    def split(self, hf_name: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        if self.tower is not None and (tensors := self.tower.split(hf_name)):
            return tensors
        short = hf_name.replace("model.language_model.", "model.")
        match = _LAYER_NAME.fullmatch(short)
        if match is not None and match.group(2) == _GATE_UP:  # (E, 2F, C): gate rows, up rows
            p, f = f"blk.{match.group(1)}.", self.expert_ffn
            return {p + "ffn_gate_exps.weight": lambda t: t[:, :f],
                    p + "ffn_up_exps.weight": lambda t: t[:, f:]}  # fmt: skip
        name = self.rename(hf_name)
        if name is None:
            return {}
        kind = name.split(".", 2)[-1]
        if kind == "ssm_conv1d.weight":
            return {name: lambda t: self._reorder(t.flatten(1), 0, self.value_dim, prefix=True)}
        dv = self.value_dim
        reorders = {"attn_qkv.weight": (0, dv, True), "attn_gate.weight": (0, dv, False),
                    "ssm_beta.weight": (0, 1, False), "ssm_alpha.weight": (0, 1, False),
                    "ssm_dt": (0, 1, False), "ssm_a": (0, 1, False),
                    "ssm_out.weight": (1, dv, False)}  # fmt: skip
        if kind in reorders:
            dim, size, prefix = reorders[kind]
            return {name: lambda t: self._reorder(t, dim, size, prefix=prefix)}
        return {name: lambda t: t}

    def _reorder(self, t: torch.Tensor, dim: int, size: int, *, prefix: bool) -> torch.Tensor:
        """The value heads along dim (each `size` wide; with `prefix` after q's and k's channels)
        from grouped by key head (k, r) to tiled (r, k)."""
        k, r = self.key_heads, self.value_heads // self.key_heads
        start = 2 * k * self.key_dim if prefix else 0
        head, values = t.narrow(dim, 0, start), t.narrow(dim, start, k * r * size)
        moved = values.unflatten(dim, (k, r, size)).transpose(dim, dim + 1).flatten(dim, dim + 2)
        return torch.cat([head, moved], dim=dim) if start else moved

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.startswith("v."):
            return tensor
        if name.endswith("_norm.weight") and not name.endswith("ssm_norm.weight"):
            return tensor.float() + 1.0
        if name.endswith(".ssm_a"):
            return -tensor.float().exp()
        return tensor

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = self.top_shapes()
        for i in range(self.num_layers):
            named = {f"blk.{i}.{k}": s for k, s in self._layer_shapes(i).items()}
            shapes |= named
            required |= set(named)
        vision = {} if self.tower is None else self.tower.shapes()
        return shapes | vision, required | set(vision)

    def _layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        c, d = self.hidden, self.head_dim
        layer: dict[str, tuple[int, ...]] = {"attn_norm.weight": (c,),
                                              "post_attention_norm.weight": (c,)}  # fmt: skip
        if self.types[i] == "full_attention":
            q, kv = self.num_heads * d, self.num_kv_heads * d
            layer |= {"attn_q.weight": (2 * q, c), "attn_k.weight": (kv, c),
                      "attn_v.weight": (kv, c), "attn_output.weight": (c, q),
                      "attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)}  # fmt: skip
        else:
            hv, inner = self.value_heads, self.value_heads * self.value_dim
            channels = 2 * self.key_heads * self.key_dim + inner
            layer |= {"attn_qkv.weight": (channels, c), "attn_gate.weight": (inner, c),
                      "ssm_beta.weight": (hv, c), "ssm_alpha.weight": (hv, c),
                      "ssm_conv1d.weight": (channels, self.kernel), "ssm_dt": (hv,),
                      "ssm_a": (hv,), "ssm_norm.weight": (self.value_dim,),
                      "ssm_out.weight": (c, inner)}  # fmt: skip
        if not self.num_experts:
            f = self.ffn
            return layer | {"ffn_gate.weight": (f, c), "ffn_up.weight": (f, c),
                            "ffn_down.weight": (c, f)}  # fmt: skip
        e, ef, sf = self.num_experts, self.expert_ffn, self.shared_ffn
        return layer | {
            "ffn_gate_inp.weight": (e, c), "ffn_gate_exps.weight": (e, ef, c),
            "ffn_up_exps.weight": (e, ef, c), "ffn_down_exps.weight": (e, c, ef),
            "ffn_gate_shexp.weight": (sf, c), "ffn_up_shexp.weight": (sf, c),
            "ffn_down_shexp.weight": (c, sf), "ffn_gate_inp_shexp.weight": (1, c),
        }  # fmt: skip

    # ------------------------------------------------------------ metadata

    def _partial(self) -> float:
        """The share of a head RoPE turns (rope_parameters', or the config's own key)."""
        own = self.text.float("partial_rotary_factor", 0.25)
        return self.rope.float("partial_rotary_factor", own)

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        kv = [self.num_kv_heads if t == "full_attention" else 0 for t in self.types]
        meta = super().metadata() | {
            f"{a}.context_length": c.int("max_position_embeddings", 262144, maximum=1 << 28),
            f"{a}.attention.head_count_kv": kv,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.rope.freq_base": self.rope.float("rope_theta", c.float("rope_theta", 1e7)),
            f"{a}.rope.dimension_count": int(self.head_dim * self._partial()),
            f"{a}.ssm.inner_size": self.value_heads * self.value_dim,
            f"{a}.ssm.state_size": self.key_dim,
            f"{a}.ssm.group_count": self.key_heads,
            f"{a}.ssm.time_step_rank": self.value_heads,
            f"{a}.ssm.conv_kernel": self.kernel,
            f"{a}.ssm.v_head_reordered": True,
        }
        if sections := self.rope.get("mrope_section"):
            meta[f"{a}.rope.mrope_section"] = [int(s) for s in sections]
            meta[f"{a}.rope.mrope_interleaved"] = bool(self.rope.get("mrope_interleaved", False))
        if self.num_experts:
            meta |= self.expert_metadata(self.num_experts, self.num_experts_used, self.expert_ffn)
            meta[f"{a}.expert_shared_feed_forward_length"] = self.shared_ffn
            meta[f"{a}.norm_top_k_prob"] = c.bool("norm_topk_prob", True)
        return meta if self.tower is None else meta | self.tower.metadata(a)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        if self.tower is not None:
            self.tower.read_processor(directory)
        return super().directory_metadata(directory)


class Qwen35MoeDecoder(Qwen35Decoder):
    arch = "qwen35moe"


class Qwen3NextDecoder(Qwen35MoeDecoder):
    """Qwen3-Next (Qwen3NextForCausalLM) as Ollama's `qwen3next`: `in_proj_qkvz`, grouped by key
    head ([q, k, v, z] each), split into `attn_qkv` and `attn_gate`; `in_proj_ba` kept as
    `ssm_ba` (grouped: beta then alpha of each key head's value heads); value heads grouped by
    key head, not reordered."""

    arch = "qwen3next"

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
            raise ConvertError("qwen3next: only a mixture on every layer is supported")

    def split(self, hf_name: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        match = _LAYER_NAME.fullmatch(hf_name)
        if match is None or match.group(2) != "linear_attn.in_proj_qkvz.weight":
            return super().split(hf_name)
        p, hk, dk = f"blk.{match.group(1)}.", self.key_heads, self.key_dim
        rdv = self.value_heads // hk * self.value_dim

        def part(start: int, size: int) -> Callable[[torch.Tensor], torch.Tensor]:
            return lambda t: t.unflatten(0, (hk, -1))[:, start : start + size].flatten(0, 1)

        parts = [part(0, dk), part(dk, dk), part(2 * dk, rdv)]
        return {p + "attn_qkv.weight": lambda t: torch.cat([f(t) for f in parts]),
                p + "attn_gate.weight": part(2 * dk + rdv, rdv)}  # fmt: skip

    def _reorder(self, t: torch.Tensor, dim: int, size: int, *, prefix: bool) -> torch.Tensor:
        return t  # Qwen3-Next's value heads stay grouped by key head

    def _layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        layer = super()._layer_shapes(i)
        if self.types[i] == "linear_attention":
            del layer["ssm_beta.weight"], layer["ssm_alpha.weight"]
            layer["ssm_ba.weight"] = (2 * self.value_heads, self.hidden)
        return layer

    def metadata(self) -> dict[str, Any]:
        return super().metadata() | {f"{self.arch}.ssm.v_head_reordered": False}
