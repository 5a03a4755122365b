"""Llama 4 checkpoints, the text model only (Llama4ForCausalLM, or the `language_model` of
Llama4ForConditionalGeneration; the vision tower is left out): Q/K rows kept as they are (HF's
Llama 4 already rotates adjacent pairs), the experts' fused 3-D `gate_up_proj` split and
transposed into llama.cpp's `ffn_{gate,up}_exps` and `down_proj` transposed into
`ffn_down_exps`, the shared expert as `ffn_*_shexp`, the router as `ffn_gate_inp`."""

from collections.abc import Callable
from typing import Any

import torch

from ember.convert.decoder import _LAYER_NAME, _TEXT_PREFIXES
from ember.convert.llama import LlamaDecoder
from ember.convert.source import ConvertError, HFConfig

_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "feed_forward.gate_proj": "ffn_gate",
    "feed_forward.up_proj": "ffn_up",
    "feed_forward.down_proj": "ffn_down",
    "feed_forward.router": "ffn_gate_inp",
    "feed_forward.shared_expert.gate_proj": "ffn_gate_shexp",
    "feed_forward.shared_expert.up_proj": "ffn_up_shexp",
    "feed_forward.shared_expert.down_proj": "ffn_down_shexp",
}
_VISION_PREFIXES = ("vision_model.", "multi_modal_projector.", "model.vision_model.",
                    "model.multi_modal_projector.")  # fmt: skip
Part = Callable[[torch.Tensor], torch.Tensor]


class Llama4Decoder(LlamaDecoder):
    arch = "llama4"
    is_permuted = False
    layer_names = _NAMES

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.expert_ffn, self.ffn = self.ffn, c.int("intermediate_size_mlp")  # HF's names swap
        self.num_experts = c.int("num_local_experts", maximum=4096)
        self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
        self.moe_interval = c.int("interleave_moe_layer_step", 1, maximum=1024)
        self.no_rope_interval = c.int("no_rope_layer_interval", 4, maximum=1024)
        self.chunk = c.int("attention_chunk_size", maximum=1 << 28)
        if c.get("hidden_act", "silu") != "silu":
            raise ConvertError("llama4: only the silu activation is supported")
        self._check_layer_pattern()

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config") if "text_config" in config.values else config

    def has_sliding_window(self) -> bool:
        return False  # Llama 4 attends in chunks, told by attention_chunk_size

    def _check_layer_pattern(self) -> None:
        """Ollama and llama.cpp place the MoE and NoPE layers by their intervals only."""
        c, layers = self.text, range(self.num_layers)
        moe = [i for i in layers if self.is_moe(i)]
        if c.get("moe_layers") is not None and c.get("moe_layers") != moe:
            raise ConvertError(f"llama4: moe_layers must be every {self.moe_interval}th layer")
        rope = [int(self.uses_rope(i)) for i in layers]
        if c.get("no_rope_layers") and c.get("no_rope_layers") != rope:
            raise ConvertError(f"llama4: no_rope_layers must be every {self.no_rope_interval}th")
        types = ["chunked_attention" if r else "full_attention" for r in rope]
        if c.get("layer_types") is not None and c.get("layer_types") != types:
            raise ConvertError("llama4: layer_types must be chunked on the RoPE layers only")

    def is_moe(self, layer: int) -> bool:
        return (layer + 1) % self.moe_interval == 0

    def uses_rope(self, layer: int) -> bool:
        return (layer + 1) % self.no_rope_interval != 0

    # ------------------------------------------------------------ names and shapes

    def rename(self, hf_name: str) -> str | None:
        if hf_name.startswith(_VISION_PREFIXES):
            return None  # the text model only
        return super().rename(hf_name)

    def split(self, hf_name: str) -> dict[str, Part]:
        name = hf_name
        for old, new in _TEXT_PREFIXES:
            if name.startswith(old):
                name = new + name.removeprefix(old)
        match = _LAYER_NAME.fullmatch(name + ".weight")
        if match is None or match.group(2) not in ("feed_forward.experts.gate_up_proj",
                                                   "feed_forward.experts.down_proj"):  # fmt: skip
            return super().split(hf_name)
        p = f"blk.{match.group(1)}."
        if match.group(2).endswith("down_proj"):  # (E, F, C) -> (E, C, F)
            return {p + "ffn_down_exps.weight": _swap}
        f = self.expert_ffn  # (E, C, 2F): gate then up along the last axis
        return {
            p + "ffn_gate_exps.weight": lambda t: _swap(t[..., :f]),
            p + "ffn_up_exps.weight": lambda t: _swap(t[..., f:]),
        }

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        for i in range(self.num_layers):
            ffn = self.moe_shapes() if self.is_moe(i) else self.dense_shapes()
            named = {f"blk.{i}.{n}": s for n, s in ffn.items()}
            shapes |= named
            required |= set(named)
        return shapes, required

    def ffn_shapes(self) -> dict[str, tuple[int, ...]]:
        return {}  # per layer: see shapes()

    def dense_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f = self.hidden, self.ffn
        return {"ffn_gate.weight": (f, c), "ffn_up.weight": (f, c), "ffn_down.weight": (c, f)}

    def moe_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f, e = self.hidden, self.expert_ffn, self.num_experts
        return {
            "ffn_gate_inp.weight": (e, c),
            "ffn_gate_exps.weight": (e, f, c),
            "ffn_up_exps.weight": (e, f, c),
            "ffn_down_exps.weight": (e, c, f),
            "ffn_gate_shexp.weight": (f, c),
            "ffn_up_shexp.weight": (f, c),
            "ffn_down_shexp.weight": (c, f),
        }

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        return super().metadata() | self.expert_metadata(
            self.num_experts, self.num_experts_used, self.expert_ffn
        ) | {
            f"{a}.interleave_moe_layer_step": self.moe_interval,
            f"{a}.no_rope_interval": self.no_rope_interval,  # Ollama's keys from here on
            f"{a}.use_qk_norm": c.bool("use_qk_norm", True),
            f"{a}.attention.chunk_size": self.chunk,
            f"{a}.attention.temperature_tuning": _truthy(c, "attn_temperature_tuning"),
            f"{a}.attention.scale": c.float("attn_scale", 0.1),
            f"{a}.attention.floor_scale": c.float("floor_scale", 8192.0),
        }


def _swap(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2)


def _truthy(c: HFConfig, key: str) -> bool:
    """A flag that early Llama 4 configs give as a number (`attn_temperature_tuning: 4`)."""
    value = c.get(key, True)
    if not isinstance(value, bool | int):
        raise ConvertError(f"{c.label}: {key} must be true or false, got {value!r}")
    return bool(value)
