"""Rerank for /api/rerank and /v1/rerank, which Ollama never had (llama-server's and Cohere's /
Jina's shape): a cross-encoder's score of every document against the query, best first, cut to
top_n. The runner scores the documents all at once, so they share its batches."""

import time
from typing import Any

from fastapi import Request

from ember.runner.client import RunnerError
from ember.server.api import RequestError, RerankRequest
from ember.server.errors import unsupported
from ember.server.state import ServerState, runner_failure
from ember.server.streaming import until_disconnected


async def rerank(state: ServerState, request: Request, req: RerankRequest) -> dict[str, Any]:
    """The response body: {"model", "object", "results": [{"index", "relevance_score",
    "document"?}], "usage", "total_duration", "load_duration"}."""
    start = time.perf_counter_ns()
    if not req.query:
        raise RequestError("query must be a non-empty string", "query")
    if not req.documents:
        raise RequestError("documents must be a non-empty list", "documents")
    empty = next((i for i, d in enumerate(req.documents) if not d), None)
    if empty is not None:
        raise RequestError(f"documents[{empty}] is empty", f"documents[{empty}]")
    plan = state.plan(req.model, req.options)
    if "rerank" not in plan.model.capabilities:
        raise unsupported(req.model, "rerank")
    async with state.lease(plan, req.keep_alive) as lease:
        work = lease.runner.rerank(req.query, req.documents, truncate=req.truncate is not False)
        try:
            result = await until_disconnected(request, work)
        except RunnerError as err:
            raise await runner_failure(err, lease.runner) from None
    count = int(result.get("prompt_eval_count", 0))
    return {
        "model": req.model,
        "object": "list",
        "results": ranked(result["scores"], req.documents, req.top_n, req.return_documents),
        "usage": {"prompt_tokens": count, "total_tokens": count},
        "total_duration": time.perf_counter_ns() - start,
        "load_duration": lease.load_duration,
    }


def ranked(
    scores: list[float], documents: list[str], top_n: int | None, with_documents: bool
) -> list[dict[str, Any]]:
    """The results best first (ties in input order), the first top_n of them."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    results: list[dict[str, Any]] = []
    for i in order[: top_n or None]:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if with_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return results
