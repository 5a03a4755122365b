"""The runner process: one model behind an HTTP API on 127.0.0.1, driven by the server.

    python -m ember runner --model PATH --port N

/health (status, load progress; once loaded, slots and KV cache cells in use), /load
(parallel, batch size, KV size and type, threads), /completion (NDJSON stream of pieces, then a
final record), /embedding, /rerank (a cross-encoder's score of each document against a query),
/tokenize, /detokenize. Bodies are JSON with snake_case keys; errors are {"error": ...} with 400
for bad input, 409 before a load, 507 when the load does not fit in memory, 500 otherwise.
"""

import asyncio
import logging
import os
import threading
import time
from dataclasses import asdict
from typing import Any, TypeVar

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from ember.backend.threads import in_fresh_thread
from ember.disconnect import ClientGone, until_disconnected
from ember.envconfig import MAX_PARALLEL
from ember.errors import EmberError
from ember.gguf import GGUFFile
from ember.model import Model, Ranker, load_model
from ember.options import Options
from ember.runner.draft import check_vocabulary
from ember.runner.engine import KV_TYPES, Engine
from ember.runner.memory import InsufficientMemoryError, release_free_heap
from ember.runner.multimodal import ImageModel, PromptInputs, image_bytes, prompt_inputs
from ember.runner.rerank import rerank_request
from ember.runner.sequence import Done, Sequence
from ember.runner.sequence import Request as SeqRequest
from ember.runner.sequence_stream import final_record, ndjson_stream, subscribe
from ember.sample.grammar import Grammar
from ember.sample.sampler import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS
from ember.tokenizer import Tokenizer

log = logging.getLogger("ember.runner")
_Body = TypeVar("_Body", bound=BaseModel)


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    parallel: int = Field(1, ge=1, le=MAX_PARALLEL)
    batch_size: int = Field(512, ge=1)
    kv_size: int = Field(4096, ge=1)  # num_ctx × parallel, as Ollama sends it
    kv_cache_type: str = ""  # "": the engine's default (f16)
    num_threads: int = Field(0, ge=0)
    flash_attention: bool | None = None  # accepted; the CPU attention kernel is always blocked
    multiuser_cache: bool = False
    draft_model: str = ""  # a GGUF with the same vocabulary, to draft for speculative decoding


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str
    options: dict[str, Any] | None = None
    format: str | dict[str, Any] | None = None
    grammar: str | None = None  # llguidance Lark text (the server's tool_choice), beside format
    logit_bias: dict[int, float] = Field(default_factory=dict)  # token id -> bias; -inf bans
    shift: bool = True
    truncate: bool = True
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    images: list[Any] = Field(default_factory=list)


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str | list[str]
    truncate: bool = True
    cut_to: int = Field(0, ge=0)  # the request's num_ctx, when the engine's is larger


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    documents: list[str]
    truncate: bool = True


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str
    add_special: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[int]


class Runner:
    """The model of this process and its engine, loaded once by /load."""

    def __init__(self, path: str, projector: str | None = None) -> None:
        self.path = path
        self.projector = projector  # an mmproj file beside the model (llama.cpp's convention)
        self.status = "launched"  # launched → loading → ready, or error
        self.progress = 0.0
        self.error: str | None = None
        self.engine: Engine | None = None
        self.tokenizer: Tokenizer | None = None
        self.lock = threading.Lock()

    def load(self, req: LoadRequest) -> None:
        with self.lock:
            if self.engine is not None:
                raise LoadConflict("the model is already loaded")
            if req.kv_cache_type and req.kv_cache_type not in KV_TYPES:
                raise EmberError(f"kv cache type {req.kv_cache_type!r} is not supported")
            num_ctx = req.kv_size // req.parallel
            if num_ctx < req.batch_size:  # Ollama's own check, with its message
                raise EmberError("kv size must be at least as large as batch size * parallel")
            if req.num_threads:
                torch.set_num_threads(req.num_threads)
            self.status, self.progress = "loading", 0.0
            try:
                gguf = GGUFFile.open(self.path)
                self.tokenizer = Tokenizer.from_metadata(gguf.metadata)
                self.progress = 0.1
                mmproj = GGUFFile.open(self.projector) if self.projector else None
                model = in_fresh_thread(lambda: load_model(gguf, mmproj))  # backend/threads.py
                draft = self._draft_model(req.draft_model) if req.draft_model else None
                release_free_heap()  # the vocabulary's build and the file's parse left much
                self.progress = 0.8
                self.engine = Engine(
                    model,
                    self.tokenizer,
                    num_parallel=req.parallel,
                    num_ctx=num_ctx,
                    num_batch=req.batch_size,
                    kv_type=req.kv_cache_type,
                    multiuser=req.multiuser_cache,
                    draft_model=draft,
                )
            except Exception as err:
                self.status, self.error = "error", str(err)
                raise
            self.status, self.progress = "ready", 1.0

    def _draft_model(self, path: str) -> Model:
        """The draft model at path, once its vocabulary is known to be the target's."""
        assert self.tokenizer is not None
        gguf = GGUFFile.open(path)
        check_vocabulary(self.tokenizer, Tokenizer.from_metadata(gguf.metadata))
        return in_fresh_thread(lambda: load_model(gguf))


class LoadConflict(EmberError):
    """A /load on a runner that has already loaded its model."""


def create_app(path: str, projector: str | None = None) -> FastAPI:
    app = FastAPI(title="ember runner", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runner = Runner(path, projector)
    app.add_api_route("/health", health, methods=["GET"])
    for route in (load, completion, embedding, rerank, tokenize, detokenize):
        app.add_api_route(f"/{route.__name__}", route, methods=["POST"])
    app.add_exception_handler(HTTPError, _http_error)  # type: ignore[arg-type]
    return app


def _runner(request: Request) -> Runner:
    runner = request.app.state.runner
    assert isinstance(runner, Runner)
    return runner


async def health(request: Request) -> dict[str, Any]:
    runner = _runner(request)
    body: dict[str, Any] = {"status": runner.status, "progress": runner.progress}
    if runner.error:
        body["error"] = runner.error
    if runner.engine is not None:
        body["busy"] = runner.engine.busy()
        body.update(asdict(runner.engine.usage()))
    return body


async def load(request: Request) -> JSONResponse:
    runner = _runner(request)
    req = await _body(request, LoadRequest)
    try:
        await asyncio.to_thread(runner.load, req)
    except InsufficientMemoryError as err:
        return _error(507, str(err))
    except LoadConflict as err:
        return _error(409, str(err))
    except EmberError as err:
        return _error(400, str(err))
    engine = runner.engine
    assert engine is not None
    return JSONResponse(
        {
            "success": True,
            "num_ctx": engine.num_ctx,
            "kv_bytes": engine.kv_bytes,
            "kv_cache_type": engine.kv_type,
        }
    )


async def completion(request: Request) -> StreamingResponse:
    req = await _body(request, CompletionRequest)
    engine, tokenizer = _ready(_runner(request))
    if req.images and not isinstance(engine.model, ImageModel):
        raise HTTPError(400, "this model does not accept images")
    try:
        opts = Options.parse(req.options)
        grammar = _grammar(req, tokenizer)
        inputs = PromptInputs(tokenizer.encode(req.prompt))
        if isinstance(engine.model, ImageModel):  # the image encoder runs once per image
            images = image_bytes(req.images)
            inputs = await asyncio.to_thread(
                prompt_inputs, req.prompt, images, tokenizer, engine.model
            )
        seq_request = SeqRequest(
            inputs.tokens,
            opts,
            same_batch=inputs.same_batch,
            multimodal=inputs.multimodal,
            image_hashes=inputs.image_hashes,
            grammar=grammar,
            shift=req.shift,
            truncate=req.truncate,
            logprobs=req.logprobs,  # top_logprobs alone asks for none, as Ollama
            top_logprobs=req.top_logprobs,
            logit_bias=_logit_bias(req.logit_bias, tokenizer.vocab_size),
        )
        seq, wake = subscribe(engine, seq_request)
    except EmberError as err:
        raise HTTPError(400, str(err)) from None
    return StreamingResponse(ndjson_stream(seq, wake), media_type="application/x-ndjson")


def _logit_bias(bias: dict[int, float], vocab_size: int) -> tuple[tuple[int, float], ...]:
    unknown = next((t for t in bias if not 0 <= t < vocab_size), None)
    if unknown is not None:
        raise EmberError(f"logit_bias names token {unknown}, outside the vocabulary ({vocab_size})")
    if sum(b <= -MAX_LOGIT_BIAS for b in bias.values()) >= vocab_size:  # ids are distinct keys
        raise EmberError("logit_bias bans every token of the vocabulary: none could be sampled")
    return tuple(bias.items())


def _grammar(req: CompletionRequest, tokenizer: Tokenizer) -> Grammar | None:
    if req.format is not None and req.grammar:
        raise EmberError("a completion takes a format or a grammar, not both")
    if req.grammar:
        return Grammar.from_format({"lark": req.grammar}, tokenizer)
    # {} is a format too: an empty schema, any JSON object as Ollama's converter makes it
    return Grammar.from_format(req.format, tokenizer) if req.format is not None else None


async def embedding(request: Request) -> dict[str, Any]:
    req = await _body(request, EmbeddingRequest)
    engine, tokenizer = _ready(_runner(request))
    texts = [req.content] if isinstance(req.content, str) else req.content
    if not texts:  # "" is an input: the tokens the vocabulary puts around a text, if any
        raise HTTPError(400, "embedding content must be a string or a non-empty list of them")
    if isinstance(engine.model, Ranker):
        raise HTTPError(400, "this model is a reranker: it scores pairs, it does not embed")
    requests = [
        SeqRequest(tokenizer.encode(text), embedding=True, truncate=req.truncate, cut_to=req.cut_to)
        for text in texts
    ]
    finals = await _run_all(request, engine, requests)
    failed = next((d for d in finals if d.embedding is None), None)
    if failed is not None:
        raise HTTPError(500, failed.error or "no embedding came back")
    vectors = [d.embedding for d in finals]
    count = sum(d.prompt_count for d in finals)
    if isinstance(req.content, str):
        return {"embedding": vectors[0], "prompt_eval_count": count}
    return {"embeddings": vectors, "prompt_eval_count": count}


async def rerank(request: Request) -> dict[str, Any]:
    """{"scores": one per document, in order; "prompt_eval_count": the pairs' tokens}."""
    req = await _body(request, RerankRequest)
    engine, tokenizer = _ready(_runner(request))
    if not req.query or not req.documents or not all(req.documents):
        raise HTTPError(400, "rerank needs a query and a non-empty list of non-empty documents")
    if not isinstance(engine.model, Ranker):
        raise HTTPError(400, "this model does not rerank")
    requests = [
        rerank_request(
            engine.model, tokenizer, req.query, doc, num_ctx=engine.num_ctx, truncate=req.truncate
        )
        for doc in req.documents
    ]
    finals = await _run_all(request, engine, requests)
    failed = next((d for d in finals if d.score is None), None)
    if failed is not None:
        raise HTTPError(500, failed.error or "no score came back")
    scores = [d.score for d in finals]
    return {"scores": scores, "prompt_eval_count": sum(d.prompt_count for d in finals)}


async def _run_all(request: Request, engine: Engine, requests: list[SeqRequest]) -> list[Done]:
    """Every request's final record; all are submitted at once, so they share batches. When the
    caller goes away (the server's client did), every one is cancelled at once: 100,000 inputs
    of an abandoned embed had held the engine for minutes."""
    subs: list[tuple[Sequence, asyncio.Event]] = []
    try:
        for sub in requests:
            subs.append(subscribe(engine, sub))
    except EmberError as err:
        for seq, _ in subs:
            seq.cancel()
        raise HTTPError(400, str(err)) from None

    async def finals() -> list[Done]:
        return [await final_record(seq, wake) for seq, wake in subs]

    try:
        return await until_disconnected(request, finals())
    except ClientGone:
        raise HTTPError(499, "the caller went away") from None
    finally:  # those not waited on yet when one failed or the caller went away
        for seq, _ in subs:
            seq.cancel()


async def tokenize(request: Request) -> dict[str, Any]:
    req = await _body(request, TokenizeRequest)
    _, tokenizer = _ready(_runner(request))
    return {"tokens": tokenizer.encode(req.content, add_special=req.add_special)}


async def detokenize(request: Request) -> dict[str, Any]:
    req = await _body(request, DetokenizeRequest)
    _, tokenizer = _ready(_runner(request))
    if any(not 0 <= t < tokenizer.vocab_size for t in req.tokens):
        raise HTTPError(400, "a token id is outside the vocabulary")
    return {"content": tokenizer.decode(req.tokens)}


async def _http_error(request: Request, err: "HTTPError") -> JSONResponse:
    return _error(err.status, err.message)


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request, kind: type[_Body]) -> _Body:
    try:
        return kind.model_validate_json(await request.body())
    except ClientDisconnect:  # the server let the request go mid-body: no one to answer, no
        raise HTTPError(499, "the server went away") from None  # traceback in its log
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise HTTPError(400, f"invalid request: {where}: {first['msg']}") from None


def _ready(runner: Runner) -> tuple[Engine, Tokenizer]:
    if runner.engine is None or runner.tokenizer is None:
        status = 500 if runner.status == "error" else 409
        raise HTTPError(status, f"model not ready: {runner.status}")
    return runner.engine, runner.tokenizer


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    log.info("the server is gone; exiting")
    os._exit(0)


def main(model: str, port: int, projector: str | None = None) -> int:
    """Serves the runner API for model on 127.0.0.1:port until killed, or until the server that
    started it is gone (a killed server must not leave its models loaded)."""
    logging.basicConfig(
        level=logging.INFO, format="time=%(asctime)s level=%(levelname)s msg=%(message)s"
    )
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    uvicorn.run(create_app(model, projector), host="127.0.0.1", port=port, log_level="warning")
    return 0
