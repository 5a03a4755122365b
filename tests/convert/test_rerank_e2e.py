"""A tiny random-weight BERT cross-encoder through `ember create` (FROM its HF folder) and a
real `ember serve`, driven with httpx as Cohere's and Jina's clients send rerank requests: the
scores of 20 documents on /v1/rerank and /api/rerank equal HF's logits within 1e-4, best first,
cut to top_n; /api/show says `rerank` only, and generate and embed are refused with a 400."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from bert_dirs import save_tiny_cross_encoder  # noqa: E402
from cli_support import EMBER, cli_env  # noqa: E402
from serve_process import Server  # noqa: E402
from test_rerank import DOCUMENTS, QUERY, ranking  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank-serve")
    directory = save_tiny_cross_encoder(root / "hf")
    server = Server(root)
    try:
        (root / "Modelfile").write_text(f"FROM {directory}\n")
        result = subprocess.run(
            [*EMBER, "create", "ranker", "-f", str(root / "Modelfile")],
            text=True, capture_output=True, timeout=300,
            env=cli_env(root, server.url.removeprefix("http://")),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        yield server, hf_scores(directory)
    finally:
        server.stop()


def hf_scores(directory: Path) -> list[float]:
    from transformers import BertForSequenceClassification, BertTokenizerFast

    hf = BertForSequenceClassification.from_pretrained(directory, attn_implementation="eager")
    tokenizer = BertTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    enc = tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return hf.eval()(**enc).logits[:, 0].tolist()


def test_cohere_request_on_v1_ranks_as_hf(served) -> None:
    server, expected = served
    body = {"model": "ranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 5,
            "return_documents": True}  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/rerank", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [r["index"] for r in results] == ranking(expected)[:5]
    for r in results:
        assert abs(r["relevance_score"] - expected[r["index"]]) < 1e-4
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    assert reply.json()["usage"]["total_tokens"] > len(DOCUMENTS)


def test_native_route_takes_text_objects_and_returns_every_score(served) -> None:
    server, expected = served
    documents = [{"text": d} for d in DOCUMENTS]
    body = {"model": "ranker", "query": QUERY, "documents": documents}
    results = httpx.post(f"{server.url}/api/rerank", json=body, timeout=60).json()["results"]
    assert [r["index"] for r in results] == ranking(expected)
    got = [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4
    body["top_n"] = 3
    results = httpx.post(f"{server.url}/api/rerank", json=body, timeout=60).json()["results"]
    assert [r["index"] for r in results] == ranking(expected)[:3]


def test_show_and_refusals(served) -> None:
    server, _ = served
    shown = httpx.post(f"{server.url}/api/show", json={"model": "ranker"}).json()
    assert shown["capabilities"] == ["rerank"]
    assert shown["model_info"]["bert.pooling_type"] == 4
    reply = httpx.post(f"{server.url}/api/generate", json={"model": "ranker", "prompt": "Hi"})
    assert (reply.status_code, reply.json()["error"]) == (400, '"ranker" does not support generate')
    reply = httpx.post(f"{server.url}/api/embed", json={"model": "ranker", "input": "Hi"})
    assert reply.status_code == 400
    reply = httpx.post(f"{server.url}/api/rerank", json={"model": "missing", "query": "q",
                                                         "documents": ["d"]})  # fmt: skip
    assert reply.status_code == 404
