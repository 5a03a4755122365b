"""The native API: /, /api/version, /api/generate, /api/chat, /api/embed, /api/embeddings,
/api/rerank, /api/ps. Bodies are parsed with api.parse_body; errors are raised as APIError or
RequestError and answered by the app's handlers. Model management lives in model_routes.py."""

import time
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from ember import OLLAMA_API_VERSION, __version__
from ember.gotime import rfc3339_nano
from ember.runner.client import RunnerError
from ember.server import embedding, generation, rerank
from ember.server.api import (
    ChatRequest,
    EmbeddingRequest,
    EmbedRequest,
    GenerateRequest,
    RerankRequest,
    parse_body,
)
from ember.server.api_schema import json_body
from ember.server.scheduler import Loaded
from ember.server.state import ServerState, runner_failure
from ember.server.streaming import respond, until_disconnected

router = APIRouter()
B = TypeVar("B", bound=BaseModel)
_FOREVER_SECONDS = 290 * 365 * 86400  # as Go's largest Duration, about 292 years


def state_of(request: Request) -> ServerState:
    state = request.app.state.ember
    if not isinstance(state, ServerState):
        raise TypeError("the app has no ServerState")
    return state


async def body_of(request: Request, kind: type[B]) -> B:
    return parse_body(kind, await request.body())


@router.get("/", response_class=PlainTextResponse)
@router.head("/", response_class=PlainTextResponse)  # a route per method: an operation id each
async def root() -> str:
    return "Ollama is running"  # verbatim: health checks and clients grep for it


@router.get("/api/version")
@router.head("/api/version")
async def version() -> dict[str, str]:
    # clients gate features on the Ollama version whose API we implement; ours is beside it
    return {"version": OLLAMA_API_VERSION, "ember_version": __version__}


@router.post("/api/generate", openapi_extra=json_body(GenerateRequest))
async def generate(request: Request) -> Response:
    req = await body_of(request, GenerateRequest)
    if req.debug_render_only:
        return await _rendered(request, req)
    chunks = generation.generate(state_of(request), req)
    stream = req.stream and not generation.is_load_form(req)
    return await respond(request, chunks, stream=stream, merge=generation.merge_generate)


@router.post("/api/chat", openapi_extra=json_body(ChatRequest))
async def chat(request: Request) -> Response:
    req = await body_of(request, ChatRequest)
    if req.debug_render_only:
        return await _rendered(request, req)
    chunks = generation.chat(state_of(request), req)
    stream = req.stream and not generation.is_load_form(req)
    return await respond(request, chunks, stream=stream, merge=generation.merge_chat)


async def _rendered(request: Request, req: GenerateRequest | ChatRequest) -> Response:
    # Ollama answers one JSON object here, streamed or not
    return JSONResponse(
        await until_disconnected(request, generation.rendered(state_of(request), req))
    )


@router.post("/api/embed", openapi_extra=json_body(EmbedRequest))
async def embed(request: Request) -> dict[str, Any]:
    req = await body_of(request, EmbedRequest)
    result = await embedding.embed(
        state_of(request),
        request,
        req.model,
        list(req.input),
        options=req.options,
        truncate=req.truncate is not False,
        dimensions=req.dimensions,
        keep_alive=req.keep_alive,
    )
    answer = {
        "model": req.model,
        "embeddings": result.vectors,
        "total_duration": result.total_duration,
        "load_duration": result.load_duration,
        "prompt_eval_count": result.prompt_eval_count,
    }
    if not req.input:  # as Ollama's answer to no input: the model and an empty list only
        return {"model": req.model, "embeddings": []}
    return answer


@router.post("/api/embeddings", openapi_extra=json_body(EmbeddingRequest))
async def embeddings(request: Request) -> dict[str, Any]:
    """The legacy form: one prompt, never truncated (Ollama's runner refuses a longer one), its
    vector as the model gives it: unit length from an embedding model (Ollama's BERT, Gemma 3
    and Qwen3 embedders normalize in their forward), raw from a decoder."""
    req = await body_of(request, EmbeddingRequest)
    state = state_of(request)
    plan = state.plan(req.model, req.options)
    embedding.check_can_embed(req.model, plan)
    async with state.lease(plan, req.keep_alive) as lease:
        if not req.prompt:
            return {"embedding": []}
        work = lease.runner.embedding(req.prompt, truncate=False)
        try:
            result = await until_disconnected(request, work)
        except RunnerError as err:
            raise await runner_failure(err, lease.runner) from None
    vector = result["embedding"]
    if "embedding" in plan.model.capabilities:
        vector = embedding.normalize(vector)
    return {"embedding": vector}


@router.post("/api/rerank", openapi_extra=json_body(RerankRequest))
async def rerank_documents(request: Request) -> dict[str, Any]:
    """Not Ollama's: llama-server's and Cohere's rerank (ember/server/rerank.py)."""
    req = await body_of(request, RerankRequest)
    return await rerank.rerank(state_of(request), request, req)


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    # as Ollama's PsHandler: the latest to expire first
    running = sorted(state_of(request).scheduler.running(), key=lambda r: -r.expires_at)
    return {"models": [_running(loaded) for loaded in running]}


def _running(loaded: Loaded) -> dict[str, Any]:
    model = loaded.info
    expires = min(loaded.expires_at, time.time() + _FOREVER_SECONDS)
    return {
        "name": model.name,
        "model": model.name,
        "size": model.size + loaded.kv_bytes,
        "digest": model.digest,
        "details": model.details,
        "expires_at": rfc3339_nano(datetime.fromtimestamp(expires)),
        "size_vram": 0,  # the CPU holds it all
        "context_length": loaded.num_ctx,
        # Ember's own fields (clients of Ollama's API ignore them): the slots the model got
        # after any fallback to a smaller parallel, those serving a request, the KV type
        "num_parallel": loaded.parallel,
        "slots_in_use": loaded.busy,
        "kv_cache_type": loaded.kv_cache_type,
    }
