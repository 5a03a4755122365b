"""Qwen3 MoE: qwen3's layers (QK-norm attention) with, in place of the MLP, a softmax top-k
router over SwiGLU experts stored as llama.cpp's 3-D `ffn_*_exps` tensors; the experts run
grouped by expert (ember/nn/moe.py) and stay in the file's type, one slice per expert."""

from dataclasses import dataclass

import torch

from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.llama import LlamaOptions
from ember.model.archs.qwen3 import Qwen3, Qwen3Attention
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import Rotation, rms_norm
from ember.nn.moe import SwiGLUExperts, mixture, softmax_top_k


@dataclass(frozen=True, slots=True)
class Qwen3MoeOptions:
    num_experts: int
    num_experts_used: int  # k: the experts each token goes to
    expert_ffn: int  # each expert's hidden size
    is_normalized: bool  # the k weights rescaled to sum to one (HF's norm_topk_prob)

    @classmethod
    def from_config(cls, c: Config) -> "Qwen3MoeOptions":
        num_experts = c.uint("expert_count", maximum=4096)
        # llama.cpp's qwen3moe always rescales; Ollama reads `norm_top_k_prob` (default true)
        is_normalized = c.bool("expert_weights_norm", c.bool("norm_top_k_prob", True))
        return cls(
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts),
            expert_ffn=c.uint("expert_feed_forward_length"),
            is_normalized=is_normalized,
        )


class Qwen3MoeBlock(Qwen3Attention):
    def __init__(self, w: Weights, i: int, o: LlamaOptions, moe: Qwen3MoeOptions) -> None:
        super().__init__(w, i, o)
        p, e, f, c = f"blk.{i}.", moe.num_experts, moe.expert_ffn, o.hidden
        self.moe = moe
        self.ffn_gate_inp = w.linear(p + "ffn_gate_inp.weight", e, c)  # the router
        self.experts = SwiGLUExperts(
            w.experts(p + "ffn_gate_exps.weight", e, f, c),
            w.experts(p + "ffn_up_exps.weight", e, f, c),
            w.experts(p + "ffn_down_exps.weight", e, c, f),
        )

    def __call__(
        self,
        x: torch.Tensor,
        rot: Rotation,
        cache: Cache,
        o: LlamaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        x = self.attend(x, rot, cache, o, outputs)
        h = rms_norm(x, self.ffn_norm, o.eps)
        k, is_normalized = self.moe.num_experts_used, self.moe.is_normalized
        routing = softmax_top_k(self.ffn_gate_inp(h), k, is_normalized=is_normalized)
        return x + mixture(h, routing, self.experts)


@register("qwen3moe")
class Qwen3Moe(Qwen3):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        self.moe_options = Qwen3MoeOptions.from_config(config)
        super().__init__(gguf, config)

    def make_block(self, w: Weights, i: int, o: LlamaOptions) -> Qwen3Attention:
        return Qwen3MoeBlock(w, i, o, self.moe_options)
