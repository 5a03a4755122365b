"""The feed-forward layers several architectures share, built from a file's weights: the SwiGLU
MLP (dense, or a shared expert), llama.cpp's stacked experts, and the mixtures whose router
scores experts as DeepSeek's does (ember/nn/moe.py's deepseek_top_k)."""

import torch
import torch.nn.functional as F

from ember.backend.weights import AnyLinear
from ember.model.weights import Weights
from ember.nn.moe import SwiGLUExperts, deepseek_top_k, mixture


class SwiGLU:
    """down(silu(gate(x)) * up(x)): the dense MLP and the shared expert."""

    def __init__(self, w: Weights, prefix: str, suffix: str, hidden: int) -> None:
        gate, up, down = (f"{prefix}ffn_{n}{suffix}.weight" for n in ("gate", "up", "down"))
        self.ffn = w.shape(gate)[0]
        self.gate_up = w.fused([gate, up], [self.ffn, self.ffn], hidden)
        self.down: AnyLinear = w.linear(down, hidden, self.ffn)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)
        return self.down(F.silu(gate_up[:, : self.ffn]) * gate_up[:, self.ffn :])


def routed_experts(w: Weights, prefix: str, num_experts: int, hidden: int) -> SwiGLUExperts:
    """The SwiGLU experts of llama.cpp's stacks `ffn_{gate,up,down}_exps`, their size from the
    tensors."""
    p, e, c = prefix, num_experts, hidden
    f = w.shape(p + "ffn_gate_exps.weight")[1]
    return SwiGLUExperts(
        w.experts(p + "ffn_gate_exps.weight", e, f, c),
        w.experts(p + "ffn_up_exps.weight", e, f, c),
        w.experts(p + "ffn_down_exps.weight", e, c, f),
    )


class ScoredMixture:
    """The top-k of `ffn_gate_inp`'s experts as deepseek_top_k picks and weighs them (a choice
    bias `exp_probs_b` where the file has one), plus the shared expert (`*_shexp`) where it has
    one: DeepSeek's, GLM's, LFM2-MoE's and Laguna's mixtures."""

    def __init__(
        self, w: Weights, prefix: str, hidden: int, num_experts: int, num_experts_used: int, *,
        sigmoid: bool, is_normalized: bool, scale: float, groups: int = 1, groups_used: int = 1,
    ) -> None:  # fmt: skip
        p, e = prefix, num_experts
        self.ffn_gate_inp = w.linear(p + "ffn_gate_inp.weight", e, hidden)
        self.bias = w.optional(p + "exp_probs_b.bias", (e,))
        self.experts = routed_experts(w, p, e, hidden)
        has_shared = w.has(p + "ffn_gate_shexp.weight")
        self.shared = SwiGLU(w, p, "_shexp", hidden) if has_shared else None
        self.num_experts_used, self.sigmoid = num_experts_used, sigmoid
        self.is_normalized, self.scale = is_normalized, scale
        self.groups, self.groups_used = groups, groups_used

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        routing = deepseek_top_k(
            self.ffn_gate_inp(x), self.num_experts_used, sigmoid=self.sigmoid, bias=self.bias,
            groups=self.groups, groups_used=self.groups_used, is_normalized=self.is_normalized,
            scale=self.scale,
        )  # fmt: skip
        routed = mixture(x, routing, self.experts)
        return routed if self.shared is None else routed + self.shared(x)
