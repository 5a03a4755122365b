"""The OpenAPI schema of the server: FastAPI's, with the JSON request bodies the routes parse
themselves (routes read `await request.body()` so that a bad body is Ollama's 400, not FastAPI's
422, so FastAPI cannot see them). Served at /openapi.json; no docs pages."""

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: its body is a JSON `model` (its $defs move to components)."""
    schema = model.model_json_schema(ref_template=_REF)
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def openapi(app: FastAPI) -> dict[str, Any]:
    """The app's schema, made once: FastAPI's, the bodies' shared models under components."""
    if app.openapi_schema is None:
        schema = copy.deepcopy(get_openapi(title=app.title, version=app.version, routes=app.routes))
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for operation in _operations(schema):
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            components.update(body.get("schema", {}).pop("$defs", {}))
        app.openapi_schema = schema
    return app.openapi_schema


def _operations(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in schema.get("paths", {}).values() for op in item.values()]


def install(app: FastAPI) -> None:
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]
