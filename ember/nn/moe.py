"""Mixture of experts: a router picks k experts for each token with a weight each; the experts
then run grouped by expert (one call per used expert over all of its tokens, never a loop over
tokens), so a step reads the weights of the routed experts only, and the outputs are summed."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from ember.backend.weights import AnyLinear


@dataclass(frozen=True, slots=True)
class Routing:
    experts: torch.Tensor  # (T, K) int64: the experts each token goes to
    weights: torch.Tensor  # (T, K) float32: what each one's output counts


def softmax_top_k(logits: torch.Tensor, k: int, *, is_normalized: bool) -> Routing:
    """Qwen's router: a softmax over all experts, the k most probable, optionally rescaled to
    sum to one (`norm_topk_prob`)."""
    weights, experts = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)  # (T, K)
    if is_normalized:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(experts, weights)


def top_k_softmax(logits: torch.Tensor, k: int) -> Routing:
    """gpt-oss's router (its bias already in the logits): the k largest logits, and a softmax
    over those k only."""
    top, experts = torch.topk(logits, k, dim=-1)  # (T, K)
    return Routing(experts, torch.softmax(top, dim=-1))


def sigmoid_top_k(logits: torch.Tensor, k: int) -> Routing:
    """Llama 4's router: the k largest logits, each weighted by its own sigmoid (no sum to
    one)."""
    top, experts = torch.topk(logits, k, dim=-1)  # (T, K)
    return Routing(experts, torch.sigmoid(top))


def deepseek_top_k(
    logits: torch.Tensor,
    k: int,
    *,
    sigmoid: bool,
    bias: torch.Tensor | None = None,
    groups: int = 1,
    groups_used: int = 1,
    is_normalized: bool = False,
    scale: float = 1.0,
) -> Routing:
    """DeepSeek's router: sigmoid (V3) or softmax (V2) scores; the k experts of the highest
    scores plus `bias` (V3's e_score_correction_bias, for the choice only), among the
    `groups_used` best of `groups` equal groups (V3 ranks a group by its two best, V2 by its
    best); each weighted by its score, rescaled to sum to one if `is_normalized`, times scale."""
    scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)  # (T, E)
    choice = scores if bias is None else scores + bias
    if groups > 1:
        grouped = choice.unflatten(-1, (groups, -1))  # (T, G, E / G)
        best = grouped.topk(2, dim=-1).values.sum(-1) if sigmoid else grouped.amax(-1)
        kept = torch.zeros_like(best, dtype=torch.bool)
        kept.scatter_(1, best.topk(groups_used, dim=-1).indices, True)
        choice = choice.masked_fill(~kept.repeat_interleave(grouped.shape[-1], dim=1), -torch.inf)
    experts = choice.topk(k, dim=-1).indices  # (T, K)
    weights = scores.gather(1, experts)
    if is_normalized:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return Routing(experts, weights * scale)


class Experts(Protocol):
    def __call__(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """The output (n, C) of one expert over the rows x (n, C) routed to it."""


class SwiGLUExperts:
    """Experts that are each a SwiGLU MLP: down(silu(gate(x)) * up(x))."""

    def __init__(
        self, gate: Sequence[AnyLinear], up: Sequence[AnyLinear], down: Sequence[AnyLinear]
    ) -> None:
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        return self.down[expert](F.silu(self.gate[expert](x)) * self.up[expert](x))


class GateUp(Protocol):
    def __call__(self, expert: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's gate and up projections (with their biases) of the rows x (n, C)."""


class SeparateGateUp:
    """llama.cpp's layout: `ffn_gate_exps` and `ffn_up_exps`, each with its bias (E, F)."""

    def __init__(
        self, gate: Sequence[AnyLinear], up: Sequence[AnyLinear], gate_bias: torch.Tensor,
        up_bias: torch.Tensor,
    ) -> None:  # fmt: skip
        self.gate, self.up, self.gate_bias, self.up_bias = gate, up, gate_bias, up_bias

    def __call__(self, expert: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate = self.gate[expert](x) + self.gate_bias[expert]
        return gate, self.up[expert](x) + self.up_bias[expert]


class InterleavedGateUp:
    """OpenAI's and Ollama's layout: one `ffn_gate_up_exps` whose rows alternate gate, up."""

    def __init__(self, gate_up: Sequence[AnyLinear], bias: torch.Tensor) -> None:
        self.gate_up, self.bias = gate_up, bias

    def __call__(self, expert: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.gate_up[expert](x) + self.bias[expert]
        return y[:, ::2], y[:, 1::2]


class ClampedSwiGLUExperts:
    """gpt-oss's experts: the gate clamped above and the up clamped both ways at `limit`, then
    down((up + 1) * gate * sigmoid(alpha * gate)) + its bias (E, C)."""

    def __init__(
        self, gate_up: GateUp, down: Sequence[AnyLinear], down_bias: torch.Tensor, *,
        alpha: float, limit: float,
    ) -> None:  # fmt: skip
        self.gate_up, self.down, self.down_bias = gate_up, down, down_bias
        self.alpha, self.limit = alpha, limit

    def __call__(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(expert, x)
        gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return self.down[expert]((up + 1) * glu) + self.down_bias[expert]


def mixture(
    x: torch.Tensor, routing: Routing, experts: Experts, *, weights_inputs: bool = False
) -> torch.Tensor:
    """x (T, C) through the experts routing names: sum over k of weight * expert(x), or with
    `weights_inputs` sum over k of expert(weight * x) (Llama 4 scales what goes in)."""
    num_tokens, num_k = routing.experts.shape
    pairs = routing.experts.flatten()  # (T * K,): token t's j-th expert at t * K + j
    order = torch.argsort(pairs, stable=True)  # the token-expert pairs grouped by expert
    used, counts = torch.unique_consecutive(pairs[order], return_counts=True)
    if num_tokens == 0:
        return torch.zeros_like(x)
    rows = x[order // num_k]  # (T * K, C): each pair's token, grouped by expert
    if weights_inputs:
        rows = rows * routing.weights.flatten()[order, None]
    groups = rows.split(counts.tolist())  # the rows of each used expert
    grouped = torch.cat([experts(e, g) for e, g in zip(used.tolist(), groups, strict=True)])
    out = torch.empty_like(grouped)
    out[order] = grouped  # back to (token, j) order; index_add_ is ~10^4 times slower on CPU
    out = out.view(num_tokens, num_k, -1)
    if weights_inputs:
        return out.sum(dim=1)
    return torch.bmm(routing.weights[:, None, :], out)[:, 0]
