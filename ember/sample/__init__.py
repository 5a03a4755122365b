"""Sampling: parameters, penalties and a seeded sampler over a row of logits, a batched step over
rows (sample_rows); logprobs."""

from ember.sample.batched import sample_rows
from ember.sample.sampler import (
    Sampler,
    SamplingParams,
    candidates,
    logprobs,
    penalize,
    truncate,
    typical,
)

__all__ = [
    "Sampler",
    "SamplingParams",
    "candidates",
    "logprobs",
    "penalize",
    "sample_rows",
    "truncate",
    "typical",
]
