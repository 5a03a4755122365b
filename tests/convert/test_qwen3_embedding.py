"""A Qwen3-Embedding folder (sentence-transformers': the base Qwen3Model's weights without the
`model.` prefix, a last-token Pooling module, Normalize, a tokenizer that appends
<|endoftext|>) converted by Ember: the file pools the last token and appends that end token, as
llama.cpp converts it, and its vectors through the engine equal sentence-transformers' own."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from bert_dirs import save_pooling
from hf_dirs import _save_bpe
from hf_families import build_family
from test_decoder_embedding import embed
from tinymodels import tiny_vocab

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import POOLING_LAST
from ember.tokenizer import Tokenizer

TEXTS = ["hello world", "the cafe is naive", "a", "numbers 12345 and symbols !?"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-embedding")
    directory = root / "hf"
    hf = build_family("qwen3", tie_word_embeddings=True)
    hf.model.save_pretrained(directory)  # the base model: tensors without `model.`
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps(config | {"architectures": ["Qwen3ForCausalLM"]})  # as the real folder says
    )
    vocab = tiny_vocab("qwen2")
    _save_bpe("qwen2", vocab, directory)
    spec = json.loads((directory / "tokenizer.json").read_text())
    end = "<|endoftext|>"
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": end, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": end, "type_id": 1}}],
        "special_tokens": {end: {"id": end, "ids": [vocab.tokens.index(end)], "tokens": [end]}},
    }  # fmt: skip
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    save_pooling(directory, "last", dim=64, extra=("Normalize",))
    convert_directory(directory, root / "model.gguf")
    return directory, root / "model.gguf"


def test_the_file_pools_the_last_token_and_appends_the_end_token(folder):
    md = GGUFFile.open(folder[1]).metadata
    assert md["qwen3.pooling_type"] == POOLING_LAST
    assert md["tokenizer.ggml.add_eos_token"] is True
    assert md["tokenizer.ggml.tokens"][md["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"


def test_vectors_equal_sentence_transformers(folder):
    st = pytest.importorskip("sentence_transformers")
    from transformers import AutoTokenizer

    directory, path = folder
    tokenizer = Tokenizer.from_metadata(GGUFFile.open(path).metadata)
    ids = [tokenizer.encode(t) for t in TEXTS]
    assert ids == [AutoTokenizer.from_pretrained(directory)(t)["input_ids"] for t in TEXTS]
    got = torch.nn.functional.normalize(torch.tensor(embed(path, ids)), dim=-1)
    expected = st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS)
    assert (got - torch.tensor(expected)).abs().max() < 1e-4
