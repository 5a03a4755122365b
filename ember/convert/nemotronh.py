"""Nemotron-H checkpoints (NemotronHForCausalLM) with llama.cpp's and Ollama's `nemotron_h` keys
and names (`nemotron_h_moe` with experts): each layer's mixer told by `attention.head_count_kv`
(its KV heads on attention layers, else 0) and `feed_forward_length` (its width on MLP and
mixture layers, else 0), Mamba 2's `ssm.*` sizes, `ssm_a` as -exp(A_log), the convolution as
(channels, kernel), the experts stacked, the router's correction bias as `exp_probs_b.bias`.
Refused: a dt limit (transformers clamps dt to it; Ember does not), multi-token-prediction
layers past the stack are left out."""

import math
import re
from collections.abc import Callable
from typing import Any

import torch

from ember.convert.decoder import TextDecoder
from ember.convert.source import ConvertError, HFConfig

_TOP = {"embeddings.weight": "token_embd.weight", "norm_f.weight": "output_norm.weight"}
_LAYER = {
    "norm.weight": "attn_norm.weight", "mixer.in_proj.weight": "ssm_in.weight",
    "mixer.conv1d.weight": "ssm_conv1d.weight", "mixer.conv1d.bias": "ssm_conv1d.bias",
    "mixer.dt_bias": "ssm_dt.bias", "mixer.A_log": "ssm_a", "mixer.D": "ssm_d",
    "mixer.norm.weight": "ssm_norm.weight", "mixer.out_proj.weight": "ssm_out.weight",
    "mixer.q_proj.weight": "attn_q.weight", "mixer.k_proj.weight": "attn_k.weight",
    "mixer.v_proj.weight": "attn_v.weight", "mixer.o_proj.weight": "attn_output.weight",
    "mixer.up_proj.weight": "ffn_up.weight", "mixer.down_proj.weight": "ffn_down.weight",
    "mixer.gate.weight": "ffn_gate_inp.weight",
    "mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mixer.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mixer.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mixer.fc1_latent_proj.weight": "ffn_latent_in.weight",
    "mixer.fc2_latent_proj.weight": "ffn_latent_out.weight",
}  # fmt: skip
_NAME = re.compile(r"(?:backbone|model)\.(?:layers\.(\d+)\.)?(.+)")
_EXPERT = re.compile(
    r"(?:backbone|model)\.layers\.(\d+)\.mixer\.experts\.(\d+)\.(up|down)_proj\.weight"
)
_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention",
          "attention": "attention", "mlp": "mlp", "moe": "moe"}  # fmt: skip


class NemotronHDecoder(TextDecoder):
    arch = "nemotron_h"

    def text_config(self, config: HFConfig) -> HFConfig:
        kinds = config.get("layers_block_type")
        if config.get("num_hidden_layers") is None and isinstance(kinds, list):
            return HFConfig({**config.values, "num_hidden_layers": len(kinds)})  # its count
        return config

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c, n = self.text, self.num_layers
        kinds = c.get("layers_block_type") or []
        if len(kinds) != n or not all(k in _KINDS for k in kinds):
            raise ConvertError("nemotron_h: layers_block_type must name each layer's mixer")
        self.kinds = [_KINDS[k] for k in kinds]
        low, high = (_number(v) for v in (c.get("time_step_limit") or [0.0, math.inf]))
        if low > 0.0 or not math.isinf(high):
            raise ConvertError("nemotron_h: a dt limit is not supported")
        self.heads = c.int("mamba_num_heads", maximum=4096)
        self.head_size = c.int("mamba_head_dim", maximum=4096)
        self.groups = c.int("n_groups", maximum=4096)
        self.state = c.int("ssm_state_size", maximum=4096)
        self.kernel = c.int("conv_kernel", 4, maximum=64)
        self.inner = self.heads * self.head_size
        if "moe" in self.kinds:
            self.arch = "nemotron_h_moe"  # type: ignore[misc]
            self.num_experts = c.int("n_routed_experts", maximum=4096)
            self.expert_ffn = c.int("moe_intermediate_size")
            self.shared_ffn = c.int("moe_shared_expert_intermediate_size")
            self.latent = c.get("moe_latent_size") or 0

    # ------------------------------------------------------------ names and shapes

    def rename(self, hf_name: str) -> str | None:
        if hf_name == "lm_head.weight":
            return None if self.is_tied else "output.weight"
        match = _NAME.fullmatch(hf_name)
        layer, rest = match.groups() if match else (None, "")
        if layer is None and rest in _TOP:
            return _TOP[rest]
        if layer is not None and int(layer) >= self.num_layers:
            return None  # a multi-token-prediction layer
        if layer is None or rest not in _LAYER:
            raise ConvertError(f"unexpected tensor {hf_name!r} for nemotron_h")
        return f"blk.{layer}.{_LAYER[rest]}"

    def stacked(self, hf_name: str) -> tuple[str, int] | None:
        match = _EXPERT.fullmatch(hf_name)
        if match is None or int(match.group(1)) >= self.num_layers:
            return None
        return f"blk.{match.group(1)}.ffn_{match.group(3)}_exps.weight", int(match.group(2))

    def split(self, hf_name: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        name = self.rename(hf_name)
        if name is None:
            return {}
        if name.endswith("ssm_conv1d.weight"):
            return {name: lambda t: t.flatten(1)}  # (channels, 1, kernel) -> (channels, kernel)
        return {name: lambda t: t}

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return -tensor.float().exp() if name.endswith(".ssm_a") else tensor

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = self.top_shapes()
        for i in range(self.num_layers):
            named = {f"blk.{i}.{k}": s for k, s in self._layer_shapes(i).items()}
            shapes |= named
            required |= {n for n in named if "latent" not in n and not n.endswith(".bias")}
        return shapes, required

    def _layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        c, kind = self.hidden, self.kinds[i]
        layer: dict[str, tuple[int, ...]] = {"attn_norm.weight": (c,)}
        if kind == "mamba":
            h, ch = self.heads, self.inner + 2 * self.groups * self.state
            return layer | {
                "ssm_in.weight": (self.inner + ch + h, c), "ssm_conv1d.weight": (ch, self.kernel),
                "ssm_conv1d.bias": (ch,), "ssm_dt.bias": (h,), "ssm_a": (h,), "ssm_d": (h,),
                "ssm_norm.weight": (self.inner,), "ssm_out.weight": (c, self.inner),
            }  # fmt: skip
        if kind == "attention":
            q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            return layer | {"attn_q.weight": (q, c), "attn_k.weight": (kv, c),
                            "attn_v.weight": (kv, c), "attn_output.weight": (c, q)}  # fmt: skip
        if kind == "mlp":
            return layer | {"ffn_up.weight": (self.ffn, c), "ffn_down.weight": (c, self.ffn)}
        e, f, sf, width = self.num_experts, self.expert_ffn, self.shared_ffn, self.latent or c
        layer |= {
            "ffn_gate_inp.weight": (e, c), "exp_probs_b.bias": (e,),
            "ffn_up_exps.weight": (e, f, width), "ffn_down_exps.weight": (e, width, f),
            "ffn_up_shexp.weight": (sf, c), "ffn_down_shexp.weight": (c, sf),
        }  # fmt: skip
        if self.latent:
            layer |= {"ffn_latent_in.weight": (self.latent, c),
                      "ffn_latent_out.weight": (c, self.latent)}  # fmt: skip
        return layer

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        ffn = {"mlp": self.ffn, "moe": getattr(self, "expert_ffn", 0)}
        meta = super().metadata() | {
            f"{a}.context_length": c.int("max_position_embeddings", 8192, maximum=1 << 28),
            f"{a}.attention.head_count_kv": [
                self.num_kv_heads if k == "attention" else 0 for k in self.kinds
            ],
            f"{a}.feed_forward_length": [ffn.get(k, 0) for k in self.kinds],
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.layer_norm_rms_epsilon": c.float("layer_norm_epsilon", 1e-5),
            f"{a}.ssm.conv_kernel": self.kernel,
            f"{a}.ssm.inner_size": self.inner,
            f"{a}.ssm.state_size": self.state,
            f"{a}.ssm.time_step_rank": self.heads,
            f"{a}.ssm.group_count": self.groups,
        }
        if "moe" in self.kinds:
            meta |= self.expert_metadata(
                self.num_experts, c.int("num_experts_per_tok", maximum=self.num_experts),
                self.expert_ffn,
            ) | {
                f"{a}.expert_shared_feed_forward_length": self.shared_ffn,
                f"{a}.expert_weights_norm": c.bool("norm_topk_prob", True),
                f"{a}.expert_weights_scale": c.float("routed_scaling_factor", 1.0),
                f"{a}.expert_group_count": c.int("n_group", 1, maximum=4096),
                f"{a}.expert_group_used_count": c.int("topk_group", 1, maximum=4096),
            }  # fmt: skip
        return meta


def _number(value: Any) -> float:
    """A config number; transformers saves infinity as {"__float__": "Infinity"}."""
    if isinstance(value, dict):
        value = value.get("__float__")
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise ConvertError(f"nemotron_h: {value!r} is not a number") from err
