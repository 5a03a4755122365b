"""Embeddings for /api/embed and /v1/embeddings: the runner's vectors for a batch of inputs,
cut to `dimensions` and scaled to unit length, as Ollama's /api/embed returns them."""

import math
import time
from dataclasses import dataclass

import numpy as np
from fastapi import Request

from ember.runner.client import RunnerError
from ember.server.api import RequestOptions
from ember.server.errors import APIError, unsupported
from ember.server.state import Plan, ServerState, runner_failure
from ember.server.streaming import until_disconnected


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: list[list[float]]
    prompt_eval_count: int
    total_duration: int
    load_duration: int


async def embed(
    state: ServerState,
    request: Request,
    name: str,
    inputs: list[str],
    *,
    options: RequestOptions | None,
    truncate: bool,
    dimensions: int | None,
    keep_alive: float | None,
) -> Embedded:
    """Every input's vector, in order; no inputs still loads the model (Ollama's load form)."""
    start = time.perf_counter_ns()
    plan = state.plan(name, options)
    check_can_embed(name, plan)
    async with state.lease(plan, keep_alive) as lease:
        vectors: list[list[float]] = []
        count = 0
        if inputs:
            # cut to the num_ctx asked for, below the 4 the scheduler loads at least
            work = lease.runner.embedding(inputs, truncate=truncate, cut_to=plan.options.num_ctx)
            try:
                result = await until_disconnected(request, work)
            except RunnerError as err:
                raise await runner_failure(err, lease.runner) from None
            vectors, count = result["embeddings"], int(result.get("prompt_eval_count", 0))
            state.metrics.prompt_tokens.labels(plan.model.name).inc(count)
    return Embedded(
        [normalize(v, dimensions) for v in vectors],
        count,
        time.perf_counter_ns() - start,
        lease.load_duration,
    )


def check_can_embed(name: str, plan: Plan) -> None:
    """A 400 for a cross-encoder: it scores pairs and has no vectors to give."""
    if "rerank" in plan.model.capabilities:
        raise unsupported(name, "embedding")


def normalize(vector: list[float], dimensions: int | None = None) -> list[float]:
    """vector cut to its first `dimensions` values, then scaled to unit length. As Ollama's,
    `dimensions` of 0 or less, or of the vector's length or more, leaves it whole."""
    if dimensions is not None and 0 < dimensions < len(vector):
        vector = vector[:dimensions]
    if not all(math.isfinite(x) for x in vector):
        raise APIError(500, "the embedding has NaN or infinite values")
    norm = math.sqrt(sum(x * x for x in vector))
    return as_float32([x / norm for x in vector] if norm > 0 else vector)


def as_float32(vector: list[float]) -> list[float]:
    """vector's values rounded to float32, each the float whose repr is float32's shortest
    form: JSON as Go writes a []float32 (-0.012556877, not -0.012556877331945932)."""
    return [float(text) for text in np.asarray(vector, dtype=np.float32).astype(str)]
