"""/api/rerank and /v1/rerank on a fake runner (a document's score is its length): results best
first with their input index, cut to top_n, documents only when asked, Cohere's {"text"}
documents, usage; a bad body is a 400, an unknown model a 404, a model that cannot rerank a 400
naming the capability, and a reranker refuses embed and generate."""

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_fakes import fake_state

from ember.server.app import create_app

DOCUMENTS = ["bb", "a", "dddd", "ccc"]


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(fake_state())) as c:
        yield c


def rerank(client: TestClient, path: str, **body: Any) -> Any:
    return client.post(path, json={"model": "ranker", "query": "which one", **body})


@pytest.mark.parametrize("path", ["/api/rerank", "/v1/rerank"])
def test_results_are_sorted_and_cut_to_top_n(client: TestClient, path: str) -> None:
    reply = rerank(client, path, documents=DOCUMENTS, top_n=3)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "ranker" and body["object"] == "list"
    assert body["results"] == [
        {"index": 2, "relevance_score": 4.0},
        {"index": 3, "relevance_score": 3.0},
        {"index": 0, "relevance_score": 2.0},
    ]
    assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 12}


def test_every_document_without_top_n_and_documents_when_asked(client: TestClient) -> None:
    cohere_v1 = [{"text": d} for d in DOCUMENTS]
    body = rerank(client, "/v1/rerank", documents=cohere_v1, return_documents=True).json()
    assert [r["index"] for r in body["results"]] == [2, 3, 0, 1]
    assert [r["document"] for r in body["results"]] == [
        {"text": t} for t in ("dddd", "ccc", "bb", "a")
    ]
    body = rerank(client, "/api/rerank", documents=DOCUMENTS, top_n=0).json()
    assert len(body["results"]) == 4 and "document" not in body["results"][0]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"query": "", "documents": ["a"]}, 400, "query must be a non-empty string"),
        ({"documents": []}, 400, "documents must be a non-empty list"),
        ({"documents": ["a", ""]}, 400, "documents[1] is empty"),
        ({"documents": [3]}, 400, 'invalid value for "documents[0]"'),
        ({"documents": ["a"], "top_n": -1}, 400, 'invalid value for "top_n"'),
        ({"model": "nope", "documents": ["a"]}, 404, "model 'nope' not found"),
        ({"model": "fake", "documents": ["a"]}, 400, '"fake" does not support rerank'),
    ],
)
def test_bad_requests(client: TestClient, body: dict[str, Any], status: int, message: str) -> None:
    native = rerank(client, "/api/rerank", **body)
    assert native.status_code == status
    assert native.json()["error"].startswith(message), native.json()
    openai = rerank(client, "/v1/rerank", **body)
    assert openai.status_code == status
    assert openai.json()["error"]["message"].startswith(message)


def test_a_reranker_neither_embeds_nor_generates(client: TestClient) -> None:
    reply = client.post("/api/embed", json={"model": "ranker", "input": ["a"]})
    assert (reply.status_code, reply.json()["error"]) == (
        400,
        '"ranker" does not support embedding',
    )
    reply = client.post("/v1/embeddings", json={"model": "ranker", "input": "a"})
    assert reply.status_code == 400
    reply = client.post("/api/embeddings", json={"model": "ranker", "prompt": "a"})
    assert reply.status_code == 400
    reply = client.post("/api/generate", json={"model": "ranker", "prompt": "Hi"})
    assert (reply.status_code, reply.json()["error"]) == (400, '"ranker" does not support generate')
