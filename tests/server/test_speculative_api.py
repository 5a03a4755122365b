"""Speculative decoding through the server: the draft counts of the runner's final record in the
final chunk, and the draft model (Modelfile DRAFT or option draft_model) loaded beside a model."""

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeStarter, fake_state

from ember.server.app import create_app


@pytest.fixture
def starter() -> FakeStarter:
    return FakeStarter()


def last(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return json.loads(response.text.splitlines()[-1])


def test_the_final_chunk_carries_the_draft_counts(starter: FakeStarter) -> None:
    with TestClient(create_app(fake_state(starter))) as client:
        options = {"draft_ngram": 8}
        gen = client.post(
            "/api/generate", json={"model": "fake", "prompt": "hi", "options": options}
        )
        chat = client.post(
            "/api/chat",
            json={
                "model": "fake",
                "messages": [{"role": "user", "content": "hi"}],
                "options": options,
                "stream": False,
            },
        )
        plain = client.post("/api/generate", json={"model": "fake", "prompt": "hi"})
    for final in (last(gen), last(chat)):
        assert (final["draft_proposed"], final["draft_accepted"]) == (3, 2)
    assert "draft_proposed" not in last(plain)


def test_a_draft_model_loads_beside_the_model(starter: FakeStarter) -> None:
    with TestClient(create_app(fake_state(starter))) as client:
        by_modelfile = client.post("/api/generate", json={"model": "drafted", "prompt": "hi"})
        by_option = client.post(
            "/api/generate",
            json={"model": "fake", "prompt": "hi", "options": {"draft_model": "other"}},
        )
        missing = client.post(
            "/api/generate",
            json={"model": "fake", "prompt": "hi", "options": {"draft_model": "nope"}},
        )
    last(by_modelfile), last(by_option)
    drafts = [(r.path, r.settings.draft_model) for r in starter.runners if r.settings]
    assert drafts == [("/models/drafted.gguf", "/models/other.gguf"),
                      ("/models/fake.gguf", "/models/other.gguf")]  # fmt: skip
    assert missing.status_code == 400 and "draft model 'nope'" in missing.json()["error"]
