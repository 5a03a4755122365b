"""The tiny EmbeddingGemma folder through `ember create` (the Dense modules' weights uploaded as
Ollama's create does) and a real `ember serve`: /api/embed, /v1/embeddings and /api/embeddings
give the same vectors, `dimensions` cuts and rescales them, `truncate` false refuses an input
past the context, /api/show lists only `embedding` and generate and chat are a 400. (nomic-bert
is served by the same generic path: test_nomic_bert.py checks its file reads as embedding-only;
one served model keeps this module's time down.)"""

import math
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path.append(str(TESTS / "server"))

from embed_dirs import save_tiny_embeddinggemma  # noqa: E402
from serve_process import Server  # noqa: E402

from ember.cli.client import Client  # noqa: E402
from ember.cli.commands import create  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODELS = {"gemma": (save_tiny_embeddinggemma, 64, "gemma3")}
TEXTS = ["hello world", "the cafe is naive", "a"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    for name, (save, _, _) in MODELS.items():
        save(root / name)
        (root / f"{name}.Modelfile").write_text(f"FROM {root / name}\n")
    server = Server(root)
    try:
        for name in MODELS:  # the CLI's own create, in process (no second interpreter to start)
            create(Client(server.url), name, root / f"{name}.Modelfile")
        with httpx.Client(base_url=server.url, timeout=120) as client:
            yield client
    finally:
        server.stop()


def unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def assert_close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_the_three_routes_give_the_same_vectors(served: httpx.Client, name: str) -> None:
    vectors = served.post("/api/embed", json={"model": name, "input": TEXTS}).json()
    data = served.post("/v1/embeddings", json={"model": name, "input": TEXTS}).json()
    assert len(vectors["embeddings"]) == len(data["data"]) == len(TEXTS)
    for text, a, b in zip(TEXTS, vectors["embeddings"], data["data"], strict=True):
        assert len(a) == MODELS[name][1]
        assert_close(a, b["embedding"])
        raw = served.post("/api/embeddings", json={"model": name, "prompt": text})
        assert_close(a, raw.json()["embedding"])  # unit length there too, as Ollama's models
    body = {"model": name, "input": TEXTS[0], "dimensions": 8}
    cut = served.post("/api/embed", json=body).json()["embeddings"][0]
    assert_close(cut, unit(vectors["embeddings"][0][:8]))
    cut = served.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    assert_close(cut, unit(vectors["embeddings"][0][:8]))


@pytest.mark.parametrize("name", MODELS)
def test_truncate_show_and_refused_generation(served: httpx.Client, name: str) -> None:
    long = "hello world " * 150  # past both tiny models' context
    reply = served.post("/api/embed", json={"model": name, "input": long, "truncate": False})
    assert reply.status_code == 400 and "context length" in reply.json()["error"]
    assert served.post("/api/embed", json={"model": name, "input": long}).status_code == 200
    legacy = served.post("/api/embeddings", json={"model": name, "prompt": long})  # never cut
    assert legacy.status_code == 400 and "context length" in legacy.json()["error"]
    shown = served.post("/api/show", json={"model": name}).json()
    assert shown["capabilities"] == ["embedding"]
    assert shown["model_info"]["general.architecture"] == MODELS[name][2]
    reply = served.post("/api/generate", json={"model": name, "prompt": "Hi"})
    assert reply.status_code == 400
    assert reply.json()["error"] == f'"{name}" does not support generate'
    messages = [{"role": "user", "content": "Hi"}]
    reply = served.post("/api/chat", json={"model": name, "messages": messages})
    assert reply.status_code == 400
    reply = served.post("/v1/chat/completions", json={"model": name, "messages": messages})
    assert reply.status_code == 400


@pytest.mark.parametrize("name", MODELS)
def test_a_cut_input_keeps_the_tokens_around_its_text(served: httpx.Client, name: str) -> None:
    """As Ollama's (its TestAllMiniLMEmbedTruncate): the text is cut, not the closing token the
    vocabulary adds, so num_ctx 4 (the least a model loads with) embeds the first two words
    as themselves."""

    def embed(text: str) -> list[float]:
        body = {"model": name, "input": text, "options": {"num_ctx": 4}}
        (vector,) = served.post("/api/embed", json=body).json()["embeddings"]
        return vector  # type: ignore[no-any-return]

    # " the" and " sky" are one token each ("▁the", "▁sky") in the tiny vocabulary
    assert_close(embed(" the sky is blue"), embed(" the sky"))
