"""The server: the FastAPI app (native, OpenAI and Anthropic routes, model management when
present) behind the middleware, its error handlers, and `serve()`, which runs it with uvicorn on
EMBER_HOST.

Settings are read here, from envconfig, once; the rest of the server gets them as arguments."""

import contextlib
import importlib
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from ember import __version__, envconfig
from ember.errors import OptionsError
from ember.runner.client import RunnerClient
from ember.server import anthropic, api_schema, middleware, openai, responses, routes
from ember.server.api import RequestError
from ember.server.errors import APIError, error_body
from ember.server.logging import log_startup, setup_logging
from ember.server.metrics import RequestCounter
from ember.server.model import Models
from ember.server.scheduler import Defaults, Runner, Scheduler
from ember.server.state import ServerState
from ember.store import Store
from ember.store.errors import StoreError

log = logging.getLogger("ember.server")


def default_state() -> ServerState:
    """The models, scheduler and defaults that EMBER_* settings describe."""
    defaults = Defaults(
        num_ctx=envconfig.context_length(),
        num_thread=envconfig.num_threads(),
        kv_cache_type=envconfig.kv_cache_type(),
        multiuser_cache=envconfig.multiuser_cache(),
    )
    load_timeout = envconfig.load_timeout()

    async def start(model_path: str, *projectors: str) -> Runner:
        return await RunnerClient.start(model_path, *projectors, timeout=load_timeout)

    scheduler = Scheduler(
        start=start,
        defaults=defaults,
        num_parallel=envconfig.num_parallel(),
        max_loaded=envconfig.max_loaded_models(),
        max_queue=envconfig.max_queue(),
        keep_alive=envconfig.keep_alive(),
    )
    return ServerState(Models(envconfig.models_dir()), scheduler, envconfig.context_length())


def create_app(state: ServerState | None = None, *, metrics: bool | None = None) -> FastAPI:
    """The app without middleware (tests call it directly); see build(). metrics: serve GET
    /metrics and count requests (None: as EMBER_METRICS says)."""
    state = state or default_state()
    if metrics is None:
        metrics = envconfig.metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await state.scheduler.close()  # runner processes end with the server

    app = FastAPI(
        title="Ember",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    api_schema.install(app)
    app.state.ember = state
    app.state.store = state.models.store()  # model_routes' store: the one models resolve in
    app.include_router(routes.router)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    model_routes = _model_routes()
    if model_routes is not None:
        app.include_router(model_routes)
    if metrics:
        app.add_api_route("/metrics", _metrics, methods=["GET"], include_in_schema=False)
        app.add_middleware(RequestCounter, metrics=state.metrics)
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestError, _request_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    return app


async def _metrics(request: Request) -> Response:
    state: ServerState = request.app.state.ember
    body = await state.metrics.exposition(state.scheduler)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _model_routes() -> Any:
    # written beside this module by another part of the project; the server works without it
    try:
        module = importlib.import_module("ember.server.model_routes")
    except ModuleNotFoundError as err:
        if err.name != "ember.server.model_routes":
            raise
        return None
    return getattr(module, "router", None)


def build(state: ServerState | None = None) -> ASGIApp:
    """The app behind its middleware, configured from EMBER_* settings."""
    return middleware.install(
        create_app(state),
        bound=envconfig.host(),
        origins=envconfig.allowed_origins(),
        api_key=envconfig.api_key(),
    )


def _body(request: Request, status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message, param), status_code=status)


async def _api_error(request: Request, err: APIError) -> JSONResponse:
    return _body(request, err.status, err.message)


async def _request_error(request: Request, err: RequestError) -> JSONResponse:
    return _body(request, 400, err.message, err.param)


async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    response = _body(request, err.status_code, str(err.detail).lower())
    response.headers.update(err.headers or {})  # a 405's Allow, as gin sends it
    return response


async def _internal_error(request: Request, err: Exception) -> JSONResponse:
    log.exception("request failed", extra={"path": request.url.path})
    return _body(request, 500, f"internal error: {type(err).__name__}: {err}")


def check_tls(tls: envconfig.TLSFiles) -> None:
    """OptionsError (one line) for a certificate and key that uvicorn would fail on."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tls.cert, tls.key)
    except FileNotFoundError as err:
        raise OptionsError(f"EMBER_TLS_CERT/EMBER_TLS_KEY: no such file {err.filename}") from None
    except (ssl.SSLError, OSError) as err:
        raise OptionsError(
            f"EMBER_TLS_CERT/EMBER_TLS_KEY: cannot use {tls.cert} with {tls.key}: {err}"
        ) from None


SHUTDOWN_GRACE = 3  # seconds that requests in flight have to end once the server is stopped


def serve() -> int:
    """Runs the server on EMBER_HOST until interrupted; HTTPS with EMBER_TLS_CERT/KEY."""
    tls = envconfig.tls_files()  # before anything starts: one of the two alone is an error
    if tls is not None:
        check_tls(tls)
    address = envconfig.host()
    open_store()
    sock = listen(address.host or "0.0.0.0", address.port)
    write_pid()
    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # every runner call is not news
    app = build()
    where = address.hostport + (" (https)" if tls else "")
    log_startup(log, address=where, version=__version__)
    prune_store()
    config = uvicorn.Config(
        app,
        log_config=None,
        # a stop does not wait for generations that may run for hours: after a moment for
        # short answers, the rest are cut, as Ollama closes its connections at once
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        ssl_certfile=str(tls.cert) if tls else None,
        ssl_keyfile=str(tls.key) if tls else None,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def open_store() -> None:
    """The model store's folders, made before anything starts: EMBER_MODELS naming a file or
    a place that cannot be written is a one-line error, as Ollama's `mkdir ...`."""
    root = envconfig.models_dir()
    try:
        Store(root)
    except OSError as err:
        reason = (err.strerror or str(err)).lower()
        raise OptionsError(f"mkdir {err.filename or root}: {reason}") from None


def write_pid() -> None:
    """This server's pid beside the model store (server.pid, what stops a background one),
    written once it listens: a start that lost the port to another server writes nothing."""
    path = envconfig.models_dir().parent / "server.pid"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()}\n")
    except OSError as err:
        log.warning("server.pid was not written", extra={"error": str(err)})


def prune_store() -> None:
    """As Ollama's serve: the blobs no model uses go at start (what a failed create uploaded,
    what a replaced model left), unless EMBER_NOPRUNE; those of the last hour stay, as a create
    or pull in another process may not have written its manifest yet."""
    if envconfig.no_prune():
        return
    try:
        removed = Store(envconfig.models_dir()).prune()
    except (OSError, StoreError) as err:
        log.warning("the model store was not pruned", extra={"error": str(err)})
        return
    if removed:
        log.info("pruned unused blobs", extra={"count": len(removed)})


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything starts: a port in use is a one-line error, as
    Ollama's `listen tcp ...: bind: address already in use`, not a log of "Listening on" and
    then uvicorn's failure (exit 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        reason = (err.strerror or str(err)).lower()
        raise OptionsError(f"listen tcp {where}: bind: {reason}") from None
    return sock
