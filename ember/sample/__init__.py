"""Sampling: parameters and a seeded sampler over a row of logits."""

from ember.sample.sampler import Sampler, SamplingParams, candidates

__all__ = ["Sampler", "SamplingParams", "candidates"]
