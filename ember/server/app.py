"""The server: the FastAPI app (native and OpenAI routes, model management when present) behind
the middleware, its error handlers, and `serve()`, which runs it with uvicorn on EMBER_HOST.

Settings are read here, from envconfig, once; the rest of the server gets them as arguments."""

import contextlib
import importlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from ember import __version__, envconfig
from ember.runner.client import RunnerClient
from ember.server import api_schema, middleware, openai, routes
from ember.server.api import RequestError
from ember.server.errors import APIError
from ember.server.logging import log_startup, setup_logging
from ember.server.model import Models
from ember.server.scheduler import Defaults, Runner, Scheduler
from ember.server.state import ServerState

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


def create_app(state: ServerState | None = None) -> FastAPI:
    """The app without middleware (tests call it directly); see build()."""
    state = state or default_state()

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
    model_routes = _model_routes()
    if model_routes is not None:
        app.include_router(model_routes)
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestError, _request_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    return app


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
    if request.url.path.startswith("/v1/"):
        return JSONResponse(openai.error_body(status, message, param), status_code=status)
    return JSONResponse({"error": message}, status_code=status)


async def _api_error(request: Request, err: APIError) -> JSONResponse:
    return _body(request, err.status, err.message)


async def _request_error(request: Request, err: RequestError) -> JSONResponse:
    return _body(request, 400, err.message, err.param)


async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    return _body(request, err.status_code, str(err.detail).lower())


async def _internal_error(request: Request, err: Exception) -> JSONResponse:
    log.exception("request failed", extra={"path": request.url.path})
    return _body(request, 500, f"internal error: {type(err).__name__}: {err}")


def serve() -> int:
    """Runs the server on EMBER_HOST until interrupted."""
    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # every runner call is not news
    address = envconfig.host()
    app = build()
    log_startup(log, address=address.hostport, version=__version__)
    uvicorn.run(app, host=address.host or "0.0.0.0", port=address.port, log_config=None)
    return 0
