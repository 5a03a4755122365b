"""Sampling: parameters, penalties and a seeded sampler over a row of logits; logprobs."""

from ember.sample.sampler import (
    Sampler,
    SamplingParams,
    candidates,
    logprobs,
    penalize,
    typical,
)

__all__ = ["Sampler", "SamplingParams", "candidates", "logprobs", "penalize", "typical"]
