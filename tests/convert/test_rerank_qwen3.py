"""A Qwen3-Reranker (a Qwen3ForCausalLM whose README says so, as llama.cpp tells it) converted
from a tiny random-weight HF checkpoint: pooling type rank, labels yes/no and the rerank
template in its GGUF; the runner's prompt ids equal HF's tokenizer's, and the scores of 10
documents through the engine (p("yes") over {"yes", "no"} at the last token, four sequences to
a batch) equal HF's within 1e-4, in the same order."""

import pytest
import torch

pytest.importorskip("transformers")

from hf_dirs import _save_bpe
from hf_families import build_family
from test_rerank import DOCUMENTS, QUERY, ranking
from tinymodels import tiny_vocab

from ember.convert import convert_directory
from ember.convert.qwen3 import RERANK_TEMPLATE
from ember.gguf import GGUFFile
from ember.model import PromptRanker, load_model
from ember.runner.engine import Engine
from ember.runner.rerank import rerank_request
from ember.runner.sequence import Done
from ember.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("qwen3-rerank") / "hf"
    model = build_family("qwen3", vocab_size=len(tiny_vocab("qwen2").tokens) + 2,
                         max_position_embeddings=512)  # fmt: skip
    with torch.no_grad():  # label rows of the size a trained head has: scores far from 0 and 1
        model.lm_head.weight[-2:] *= 0.1
    model.save_pretrained(directory)
    _save_bpe("qwen2", tiny_vocab("qwen2"), directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(["yes", "no"])  # the label tokens, one id each as in Qwen's vocabulary
    tokenizer.save_pretrained(directory)
    (directory / "README.md").write_text("# Qwen3-Reranker-tiny\n\nA test model.\n")
    convert_directory(directory, directory.parent / "model.gguf")
    return model, tokenizer, directory.parent / "model.gguf"


def test_the_readme_makes_a_reranker(tiny) -> None:
    md = GGUFFile.open(tiny[2]).metadata
    assert md["qwen3.pooling_type"] == 4
    assert md["qwen3.classifier.output_labels"] == ["yes", "no"]
    assert md["tokenizer.chat_template.rerank"] == RERANK_TEMPLATE


def test_scores_of_10_documents_equal_hf(tiny) -> None:
    hf, hf_tokenizer, path = tiny
    yes, no = hf_tokenizer.convert_tokens_to_ids(["yes", "no"])
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    assert isinstance(model, PromptRanker)
    documents = DOCUMENTS[:10]  # prompts of ~250 tokens each: ten tell enough
    requests = [
        rerank_request(model, tokenizer, QUERY, d, num_ctx=512, truncate=True) for d in documents
    ]
    expected = []
    for document, request in zip(documents, requests, strict=True):
        prompt = RERANK_TEMPLATE.format(query=QUERY, document=document)
        ids = hf_tokenizer(prompt)["input_ids"]
        assert list(request.inputs) == ids, document
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        expected.append(float(torch.softmax(logits[[yes, no]], dim=-1)[0]))
    engine = Engine(model, tokenizer, num_parallel=4, num_ctx=512, num_batch=512, kv_type="f32")
    try:
        seqs = [engine.submit(r) for r in requests]
        got = []
        for seq in seqs:
            while not isinstance(event := seq.events.get(timeout=120), Done):
                pass
            assert event.score is not None, event.error
            got.append(event.score)
    finally:
        engine.close()
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4
    assert ranking(got) == ranking(expected)
    assert max(expected) - min(expected) > 0.02  # documents told apart, not tied
