"""The OpenAPI schema the server publishes: every route, and the JSON bodies the routes parse
themselves, with their shared models under components (what schemathesis fuzzes)."""

from fastapi.testclient import TestClient
from server_fakes import fake_state

from ember.server.app import create_app


def test_openapi_json_describes_every_route_and_its_json_body():
    with TestClient(create_app(fake_state())) as client:
        schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    assert {"/api/generate", "/api/chat", "/v1/chat/completions", "/api/pull"} <= set(paths)
    assert {"/v1/responses", "/v1/messages", "/v1/messages/count_tokens"} <= set(paths)
    assert set(paths["/"]) == {"get", "head"}
    for path, item in paths.items():
        for method, operation in item.items():
            if method not in ("post", "delete") or path == "/v1/responses/{response_id}":
                continue  # the id in the path is the whole request there
            content = operation["requestBody"]["content"]
            if path == "/api/blobs/{digest}":
                assert "application/octet-stream" in content
                continue
            body = content["application/json"]["schema"]
            assert "$defs" not in body and body["properties"], path
    components = schema["components"]["schemas"]
    generate = paths["/api/generate"]["post"]["requestBody"]["content"]["application/json"]
    ref = generate["schema"]["properties"]["options"]["anyOf"][0]["$ref"]
    assert ref == "#/components/schemas/RequestOptions" and "RequestOptions" in components
    ids = [op["operationId"] for item in paths.values() for op in item.values()]
    assert len(ids) == len(set(ids))
