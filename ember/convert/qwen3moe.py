"""Qwen3 MoE checkpoints: qwen3's attention, and in every layer a router (`mlp.gate`) over
experts whose per-expert HF tensors are stacked into llama.cpp's 3-D `ffn_*_exps` tensors."""

import re
from typing import Any

from ember.convert.decoder import _LAYER, expert_pattern
from ember.convert.qwen3 import Qwen3Decoder, Qwen3VLDecoder
from ember.convert.source import ConvertError, HFConfig


class Qwen3MoeDecoder(Qwen3Decoder):
    arch = "qwen3moe"
    layer_names = _LAYER | {"mlp.gate": "ffn_gate_inp"}
    expert_names = expert_pattern("mlp.experts")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        key = "num_experts" if c.get("num_experts") is not None else "num_local_experts"
        self.num_experts = c.int(key, maximum=4096)
        self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
        self.expert_ffn = c.int("moe_intermediate_size")
        self.is_normalized = c.bool("norm_topk_prob", False)
        if c.get("mlp_only_layers", []) or c.get("decoder_sparse_step", 1) != 1:
            raise ConvertError("qwen3moe: dense layers between the MoE layers are not supported")

    def ffn_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f, e = self.hidden, self.expert_ffn, self.num_experts
        return {
            "ffn_gate_inp.weight": (e, c),
            "ffn_gate_exps.weight": (e, f, c),
            "ffn_up_exps.weight": (e, f, c),
            "ffn_down_exps.weight": (e, c, f),
        }

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        return super().metadata() | self.expert_metadata(
            self.num_experts, self.num_experts_used, self.expert_ffn
        ) | {
            f"{a}.expert_weights_norm": self.is_normalized,
        }


class Qwen3VLMoeDecoder(Qwen3VLDecoder, Qwen3MoeDecoder):
    """Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration) as Ollama's `qwen3vlmoe`: Qwen3 MoE's
    layers under Qwen3-VL's tower. transformers saves each layer's experts as two 3-D tensors
    (gate_up_proj (E, 2F, C): the gate's rows, then the up's; down_proj (E, C, F)), and its
    router always rescales the k weights."""

    arch = "qwen3vlmoe"

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.is_normalized = True

    def rename(self, hf_name: str) -> str | None:
        match = _FUSED.fullmatch(hf_name)
        if match is not None and match.group(2) == "down_proj":
            return f"blk.{match.group(1)}.ffn_down_exps.weight"
        return super().rename(hf_name)

    def split(self, hf_name: str) -> dict[str, Any]:
        match = _FUSED.fullmatch(hf_name)
        if match is not None and match.group(2) == "gate_up_proj":
            p, f = f"blk.{match.group(1)}.", self.expert_ffn
            return {p + "ffn_gate_exps.weight": lambda t: t[:, :f],
                    p + "ffn_up_exps.weight": lambda t: t[:, f:]}  # fmt: skip
        return super().split(hf_name)


_FUSED = re.compile(
    r"model\.(?:language_model\.)?layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)"
)
