"""Sampling: parameters (params.py), penalties and a seeded sampler over a row of logits
(sampler.py), a batched step over rows (batched.py: sample_rows), grammars (grammar.py).
Only the parameters load with the package: the server checks options without torch."""

from ember.sample.params import SamplingParams

__all__ = ["SamplingParams"]
