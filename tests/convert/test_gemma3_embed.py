"""EmbeddingGemma converted from a sentence-transformers folder: a tiny random-weight
Gemma3TextModel with bidirectional attention (six layers: five sliding, whose window inputs of 12
tokens outgrow) plus two random Dense modules. Its hidden states equal transformers' within
1e-4, batched as alone, and embeddings through the runner's engine equal sentence-transformers'
own pipeline on the folder (mean pooling, Dense, Dense, unit length) within 1e-5."""

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from embed_dirs import DENSE, save_tiny_embeddinggemma
from embed_dirs import GEMMA_HIDDEN as HIDDEN
from encoders import embed, ember_hidden

from ember.convert import ConvertError, convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.model.archs.gemma3 import Gemma3Options
from ember.model.archs.gemma3_embed import Gemma3Embedding
from ember.model.config import Config
from ember.runner.engine import Engine
from ember.tokenizer import Tokenizer

pytest.importorskip("transformers")

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog again and again", "a",
         "Sentence embeddings capture meaning; numbers 12345 too."]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddinggemma")
    model, dense = save_tiny_embeddinggemma(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    return model, dense, root


def hf_hidden(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0]


def test_metadata_as_ollama_writes_it(tiny) -> None:
    gguf = GGUFFile.open(tiny[2] / "model.gguf")
    md = gguf.metadata
    assert md["general.architecture"] == "gemma3"
    assert md["gemma3.pooling_type"] == 1 and md["gemma3.attention.causal"] is False
    assert md["gemma3.attention.sliding_window"] == 8
    assert gguf.tensors["dense.0.weight"].shape == (DENSE, HIDDEN)
    assert gguf.tensors["dense.1.weight"].shape == (HIDDEN, DENSE)
    assert "output.weight" not in gguf.tensors and "output_norm.weight" in gguf.tensors
    assert md["tokenizer.ggml.add_bos_token"] is True and md["tokenizer.ggml.add_eos_token"]


def test_hidden_states_equal_hf_batched_or_alone(tiny) -> None:
    hf, _, root = tiny
    gguf = GGUFFile.open(root / "model.gguf")
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    seqs = [tokenizer.encode(t) for t in TEXTS]
    assert max(len(s) for s in seqs) > 12  # past the window of the sliding layers
    together = ember_hidden(model, seqs)
    for ids, rows in zip(seqs, together, strict=True):
        expected = hf_hidden(hf, ids)
        assert torch.allclose(rows, expected, atol=1e-4), (rows - expected).abs().max()
        (alone,) = ember_hidden(model, [ids])
        assert torch.allclose(alone, rows, atol=1e-5)


def test_engine_embeddings_equal_sentence_transformers(tiny) -> None:
    st = pytest.importorskip("sentence_transformers")
    hf, dense, root = tiny
    gguf = GGUFFile.open(root / "model.gguf")
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    engine = Engine(model, tokenizer, num_parallel=4, num_ctx=64, num_batch=64)
    try:
        together = embed(engine, tokenizer, TEXTS)
        alone = [embed(engine, tokenizer, [t])[0] for t in TEXTS]
    finally:
        engine.close()
    pipeline = st.SentenceTransformer(str(root / "hf"), device="cpu")  # reads our folder
    expected = pipeline.encode(TEXTS, convert_to_tensor=True)
    for text, a, b, want in zip(TEXTS, together, alone, expected, strict=True):
        assert tokenizer.encode(text) == pipeline.tokenizer(text)["input_ids"]  # <bos> ... <eos>
        pooled = hf_hidden(hf, tokenizer.encode(text)).mean(dim=0)
        by_hand = pooled @ dense[0].T @ dense[1].T  # what the pipeline is: mean, Dense, Dense
        assert torch.allclose(want, by_hand / by_hand.norm(), atol=1e-6)
        assert len(a) == HIDDEN
        assert torch.allclose(torch.tensor(a), want, atol=1e-5), text
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    with pytest.raises(Exception, match="embedding model"):
        model.logits(torch.zeros(1, HIDDEN))


def as_llama_cpp(source: Path, out: Path) -> None:
    """A copy of an Ollama-form EmbeddingGemma file in llama.cpp's form: `gemma-embedding`
    keys, rope.freq_base_swa, dense_2 and dense_3."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(out, "gemma-embedding")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        name = field.name.replace("gemma3.", "gemma-embedding.")
        name = name.replace("rope.local.freq_base", "rope.freq_base_swa")
        writer.add_key_value(name, field.contents(), field.types[0], field.types[-1])
    names = {"dense.0.weight": "dense_2.weight", "dense.1.weight": "dense_3.weight"}
    for t in reader.tensors:
        data = np.array(t.data).reshape(tuple(int(n) for n in reversed(t.shape)))
        writer.add_tensor(names.get(t.name, t.name), data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_llama_cpp_form_loads_the_same(tiny) -> None:
    root = tiny[2]
    as_llama_cpp(root / "model.gguf", root / "llama-cpp.gguf")
    ours = load_model(GGUFFile.open(root / "model.gguf"))
    theirs = load_model(GGUFFile.open(root / "llama-cpp.gguf"))
    assert isinstance(theirs, Gemma3Embedding) and len(theirs.dense) == 2
    ids = [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 1]
    (a,), (b,) = ember_hidden(ours, [ids]), ember_hidden(theirs, [ids])
    assert torch.equal(a, b)
    assert torch.equal(ours.project(a[:1]), theirs.project(b[:1]))
    md = GGUFFile.open(root / "llama-cpp.gguf").metadata
    assert Gemma3Options.from_config(Config(md)).local_rope.base == 10_000.0
    md = dict(md) | {"gemma-embedding.rope.freq_base_swa": 500.0}  # the key is read
    assert Gemma3Options.from_config(Config(md)).local_rope.base == 500.0


def test_a_dense_module_with_bias_is_refused(tiny, tmp_path: Path) -> None:
    shutil.copytree(tiny[2] / "hf", tmp_path / "hf")
    spec = json.loads((tmp_path / "hf" / "3_Dense" / "config.json").read_text())
    (tmp_path / "hf" / "3_Dense" / "config.json").write_text(json.dumps(spec | {"bias": True}))
    with pytest.raises(ConvertError, match="without bias"):
        convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    (tmp_path / "hf" / "modules.json").unlink()
    with pytest.raises(ConvertError, match=r"modules\.json"):
        convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
