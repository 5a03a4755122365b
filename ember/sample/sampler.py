"""Token sampling as Ollama orders it: greedy at temperature 0, else top_k, temperature,
softmax, top_p, min_p, then a seeded draw. (Penalties and grammars come with the full sampler.)"""

from dataclasses import dataclass

import torch

from ember.errors import OptionsError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    seed: int = -1  # -1: a fresh random seed

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise OptionsError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise OptionsError(f"top_k must be >= 0, got {self.top_k}")
        for name in ("top_p", "min_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise OptionsError(f"{name} must be within [0, 1], got {getattr(self, name)}")


class Sampler:
    """Draws the next token from one row of logits; owns its random generator."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed >= 0:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()

    def sample(self, logits: torch.Tensor) -> int:
        """logits (V,) float32 -> a token id."""
        p = self.params
        if p.temperature == 0:
            return int(logits.argmax())
        ids, probs = candidates(logits, p)
        choice = torch.multinomial(probs, 1, generator=self.generator)
        return int(ids[choice])


def candidates(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids still allowed after top_k, top_p and min_p, with their probabilities (descending)."""
    k = p.top_k if 0 < p.top_k < logits.numel() else logits.numel()
    values, ids = logits.topk(k)  # sorted descending
    probs = torch.softmax(values / max(p.temperature, 1e-7), dim=-1)
    if p.top_p < 1.0:
        # keep the smallest prefix whose cumulative probability exceeds top_p
        before = probs.cumsum(0) - probs
        probs = probs[before < p.top_p] if p.top_p > 0 else probs[:1]
        ids = ids[: probs.numel()]
    if p.min_p > 0.0:
        keep = probs >= p.min_p * probs[0]
        probs, ids = probs[keep], ids[keep]
    if not bool(torch.isfinite(probs.sum())):
        raise ValueError("logits sum to NaN")
    return ids, probs
