"""A BERT cross-encoder (BertForSequenceClassification, one label) converted from HF: its GGUF
carries the pooler and classifier as llama.cpp's `cls` / `cls.output` with pooling type rank;
the runner's pair inputs equal HF's pair encoding (ids and token types), and the scores of 20
documents, ranked through the engine in shared batches, equal HF's logits and order."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from bert_dirs import save_tiny_cross_encoder

from ember.convert import ConvertError, convert_directory
from ember.gguf import GGUFFile
from ember.model import Ranker, load_model
from ember.runner.engine import Engine
from ember.runner.rerank import pair_request
from ember.runner.sequence import Done
from ember.tokenizer import Tokenizer

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "hello world",
    "The cafe is naive.",
    "tokening tokenly tokened",
    "北京",
    "a b c d e f g",
    "The capital is Paris!",
    "world hello the",
    "France, Paris, capital?",
    "123 456 789",
    "the the the the",
    "Hello! World?",
    "cafe au lait",
    "naive token",
    "It's $5.",
    "京 北 京",
    "z y x w v",
    "what is it",
    "hello capital",
    "France",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("rerank")
    hf = save_tiny_cross_encoder(root / "hf")
    convert_directory(hf, root / "model.gguf")
    return hf, root / "model.gguf"


def test_metadata_and_head_tensors(tiny: tuple[Path, Path]) -> None:
    gguf = GGUFFile.open(tiny[1])
    md = gguf.metadata
    assert md["bert.pooling_type"] == 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK
    assert md["bert.classifier.output_labels"] == ["LABEL_0"]
    shapes = {n: gguf.tensors[n].shape for n in gguf.tensors if n.startswith("cls")}
    assert shapes == {
        "cls.weight": (32, 32),
        "cls.bias": (32,),
        "cls.output.weight": (1, 32),
        "cls.output.bias": (1,),
    }
    assert isinstance(load_model(gguf), Ranker)


def test_pairs_encode_as_hf(tiny: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(tiny[0] / "tokenizer.json"))
    ours = Tokenizer.from_metadata(GGUFFile.open(tiny[1]).metadata)
    for document in DOCUMENTS:
        request = pair_request(ours, QUERY, document, num_ctx=64, truncate=True)
        expected = hf.encode(QUERY, document)
        assert list(request.inputs) == expected.ids, document
        assert list(request.token_types) == expected.type_ids, document


def test_scores_of_20_documents_equal_hf(tiny: tuple[Path, Path]) -> None:
    from transformers import BertForSequenceClassification, BertTokenizerFast

    hf_dir, path = tiny
    hf = BertForSequenceClassification.from_pretrained(hf_dir, attn_implementation="eager").eval()
    hf_tok = BertTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"))
    expected = []
    for document in DOCUMENTS:
        enc = hf_tok(QUERY, document, return_tensors="pt")
        with torch.no_grad():
            logits = hf(enc["input_ids"], token_type_ids=enc["token_type_ids"]).logits
        expected.append(float(logits[0, 0]))
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    engine = Engine(model, tokenizer, num_parallel=4, num_ctx=64, num_batch=64)
    try:
        together = scores(engine, tokenizer, DOCUMENTS)  # four at a time share a batch
        alone = [scores(engine, tokenizer, [d])[0] for d in DOCUMENTS[:5]]
    finally:
        engine.close()
    worst = max(abs(a - b) for a, b in zip(together, expected, strict=True))
    assert worst < 1e-4, worst
    assert ranking(together) == ranking(expected)
    assert max(expected) - min(expected) > 0.5  # the order is not a tie broken by index
    assert max(abs(a - b) for a, b in zip(alone, together, strict=False)) < 1e-5


def test_a_long_document_loses_its_end_as_hf_truncates_it(tiny: tuple[Path, Path]) -> None:
    from transformers import BertForSequenceClassification, BertTokenizerFast

    hf_dir, path = tiny
    long_document = " ".join(DOCUMENTS)  # well past the model's 64 positions
    hf = BertForSequenceClassification.from_pretrained(hf_dir, attn_implementation="eager").eval()
    hf_tok = BertTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"))
    enc = hf_tok(QUERY, long_document, truncation="only_second", max_length=64, return_tensors="pt")
    with torch.no_grad():
        expected = float(hf(**enc).logits[0, 0])
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    request = pair_request(tokenizer, QUERY, long_document, num_ctx=64, truncate=True)
    assert list(request.inputs) == enc["input_ids"][0].tolist()
    engine = Engine(model, tokenizer, num_parallel=1, num_ctx=64, num_batch=64)
    try:
        (got,) = scores(engine, tokenizer, [long_document])
    finally:
        engine.close()
    assert abs(got - expected) < 1e-4


def scores(engine: Engine, tokenizer: Tokenizer, documents: list[str]) -> list[float]:
    pairs = [
        pair_request(tokenizer, QUERY, d, num_ctx=engine.num_ctx, truncate=True) for d in documents
    ]
    seqs = [engine.submit(pair) for pair in pairs]
    out = []
    for seq in seqs:
        while not isinstance(event := seq.events.get(timeout=60), Done):
            pass
        assert event.score is not None and event.embedding is None, event.error
        out.append(event.score)
    return out


def ranking(values: list[float]) -> list[int]:
    return sorted(range(len(values)), key=lambda i: -values[i])


def test_a_classifier_of_two_labels_is_not_converted(tmp_path: Path) -> None:
    import json

    hf = save_tiny_cross_encoder(tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    config["id2label"] = {"0": "no", "1": "yes"}
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="single-label"):
        convert_directory(hf, tmp_path / "model.gguf")


def test_runner_routes_rerank_only_with_a_ranker(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    from bert_dirs import save_tiny_bert
    from fastapi.testclient import TestClient

    from ember.runner.server import create_app

    load = {"parallel": 2, "kv_size": 128, "batch_size": 64}
    body = {"query": QUERY, "documents": DOCUMENTS[:3]}
    with TestClient(create_app(str(tiny[1]))) as runner:
        assert runner.post("/load", json=load).status_code == 200
        reply = runner.post("/rerank", json=body).json()
        assert len(reply["scores"]) == 3 and reply["prompt_eval_count"] > 3
        refused = runner.post("/embedding", json={"content": "hello"})
        assert refused.status_code == 400 and "reranker" in refused.json()["error"]
        empty = runner.post("/rerank", json={"query": QUERY, "documents": []})
        assert empty.status_code == 400
    convert_directory(save_tiny_bert(tmp_path / "hf"), tmp_path / "embed.gguf")
    with TestClient(create_app(str(tmp_path / "embed.gguf"))) as runner:
        assert runner.post("/load", json=load).status_code == 200
        refused = runner.post("/rerank", json=body)
        assert refused.status_code == 400 and "does not rerank" in refused.json()["error"]
