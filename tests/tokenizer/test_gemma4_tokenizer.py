"""Gemma 4's tokenizer: a "▁" BPE from tokenizer.json (no tokenizer.model), converted as Ollama's
converter writes it (model llama, pre gemma4, the file's merges) and encoded with those merges.

The oracle is HF `tokenizers` on a small synthetic Gemma-4-style tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizer_vocabs import pieces_of, spm_metadata
from tokenizers import (
    AddedToken,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers import Tokenizer as HFTokenizer

from ember.convert.source import ConvertError, HFConfig
from ember.convert.vocab import tokenizer_metadata
from ember.tokenizer import Tokenizer, VocabularyError
from ember.tokenizer.vocab import TokenType, read_vocabulary

SPACE = "\u2581"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
TURNS = ["<start_of_turn>", "<end_of_turn>"]
USER_DEFINED = "<tool_call>"  # an added token that is not special
PADDED_ROWS = 3
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello there! the world is wide.",
    "tokenizers merge pairs of pieces into longer pieces",
    "a café serves crème brûlée and naïve visitors",
    "numbers like 12345 and 2024-06-01 appear too",
    "line one\nline two\n\nindented  with  two  spaces",
    "The Quick Brown Fox; THE LAZY DOG? (quoted) 'single' \"double\"",
    "user: what is the weather?\nmodel: it is sunny in the world today.",
]
TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "Hello World",
    " leading space",
    "trailing space ",
    "   three leading and    inner   spaces   ",
    "line one\nline two\n\n\nthree newlines",
    "\n",
    " ",
    "tab\tseparated",
    "café crème brûlée naïve é",
    "中文 text",
    "emoji 🙂 and 🚀!",
    "<start_of_turn>user\nhello there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>the world<eos>",
    "text around<tool_call>a call<tool_call>",
    "<start_of_turn><end_of_turn>",
    "unknownwordzzz qqq xyzzy",
    "12345 67890 2024-06-01",
    "",
]


def train_pieces() -> tuple[list[str], list[list[str]]]:
    """Pieces (in training order) and merges of a BPE trained on CORPUS with Gemma 4's
    normalizer, split before each "▁" while training (pieces such as "▁the"), then runs of
    "▁" and of newlines, merged last."""
    trainer_tok = HFTokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Replace(" ", SPACE)
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=420, show_progress=False, special_tokens=[])
    trainer_tok.train_from_iterator(CORPUS * 4, trainer)
    spec = json.loads(trainer_tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges = [m.split(" ") if isinstance(m, str) else m for m in spec["model"]["merges"]]
    pieces = sorted(vocab, key=vocab.__getitem__)
    for run in (SPACE, "\n"):
        merges += [[run, run], [run * 2, run], [run * 2, run * 2]]
        pieces += [run * 2, run * 3, run * 4]
    return pieces, merges


def gemma4_like(directory: Path) -> HFTokenizer:
    """A Gemma-4-style tokenizer.json (with tokenizer_config.json) saved in `directory`."""
    pieces, merges = train_pieces()
    vocab: dict[str, int] = {}
    for token in [*SPECIALS, *TURNS, *(f"<0x{b:02X}>" for b in range(256)), *pieces]:
        vocab.setdefault(token, len(vocab))
    vocab[USER_DEFINED] = len(vocab)
    model = models.BPE(
        vocab=vocab,
        merges=[(left, right) for left, right in merges],
        byte_fallback=True,
        unk_token="<unk>",
        fuse_unk=True,
    )
    tok = HFTokenizer(model)
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens([*SPECIALS, *TURNS])
    tok.add_tokens([AddedToken(USER_DEFINED, special=False, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
              "pad_token": "<pad>", "add_bos_token": True}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory) -> tuple[HFTokenizer, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("gemma4")
    hf = gemma4_like(directory)
    metadata = tokenizer_metadata(
        directory, HFConfig({}), vocab_size=hf.get_vocab_size() + PADDED_ROWS
    )
    return hf, metadata


def test_the_converter_writes_what_ollamas_does(
    gemma4: tuple[HFTokenizer, dict[str, Any]],
) -> None:
    hf, meta = gemma4
    assert meta["tokenizer.ggml.model"] == "llama"
    assert meta["tokenizer.ggml.pre"] == "gemma4"
    assert meta["tokenizer.ggml.add_space_prefix"] is False
    assert meta["tokenizer.ggml.add_bos_token"] is True
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    size = hf.get_vocab_size()
    assert len(tokens) == len(types) == len(meta["tokenizer.ggml.scores"]) == size + PADDED_ROWS
    assert {t: i for i, t in enumerate(tokens[:size])} == hf.get_vocab()
    spec = json.loads(hf.to_str())
    assert meta["tokenizer.ggml.merges"] == [" ".join(m) for m in spec["model"]["merges"]]
    kinds = dict(zip(tokens, types, strict=True))
    assert {kinds[t] for t in [*SPECIALS, *TURNS]} == {TokenType.CONTROL}
    assert kinds[USER_DEFINED] == TokenType.USER_DEFINED
    assert {kinds[f"<0x{b:02X}>"] for b in range(256)} == {TokenType.BYTE}
    assert kinds[f"{SPACE}the"] == TokenType.NORMAL
    assert set(types[size:]) == {TokenType.UNUSED}
    assert meta["tokenizer.ggml.bos_token_id"] == hf.token_to_id("<bos>")
    assert meta["tokenizer.ggml.eos_token_id"] == hf.token_to_id("<eos>")


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_hf_tokenizers(gemma4: tuple[HFTokenizer, dict[str, Any]], text: str) -> None:
    hf, meta = gemma4
    tok = Tokenizer.from_metadata(meta)
    expected = hf.encode(text, add_special_tokens=False).ids
    assert tok.encode(text, add_special=False) == expected
    assert tok.encode(text) == [hf.token_to_id("<bos>"), *expected]
    assert tok.decode(expected) == text
    stream = tok.stream_decoder()
    assert "".join(stream.push(i) for i in expected) + stream.flush() == text


def test_the_text_needs_the_files_merges_and_byte_fallback(
    gemma4: tuple[HFTokenizer, dict[str, Any]],
) -> None:
    hf, meta = gemma4
    tok = Tokenizer.from_metadata(meta)
    ids = tok.encode("hello world", add_special=False)
    assert len(ids) < len("hello world")  # merged pieces, not characters
    assert pieces_of(meta, tok.encode("中", add_special=False)) == ["<0xE4>", "<0xB8>", "<0xAD>"]
    assert tok.encode(" x", add_special=False)[0] == hf.token_to_id(SPACE)  # no dummy prefix
    assert tok.vocabulary.add_space_prefix is False


def test_an_ollama_written_file_reads_the_same(
    gemma4: tuple[HFTokenizer, dict[str, Any]],
) -> None:
    """Ollama's converter types the <0xHH> pieces normal, scores each token by its id and writes
    no add_space_prefix: its engine still reads them as bytes, with no dummy prefix, and ranks by
    the merges (those scores, ranking later pieces first, would give other ids)."""
    hf, meta = gemma4
    tokens = meta["tokenizer.ggml.tokens"]
    types = [
        TokenType.NORMAL if t == TokenType.BYTE else t for t in meta["tokenizer.ggml.token_type"]
    ]
    ollama = {k: v for k, v in meta.items() if k != "tokenizer.ggml.add_space_prefix"}
    ollama["tokenizer.ggml.token_type"] = types
    ollama["tokenizer.ggml.scores"] = [float(i) for i in range(len(tokens))]
    tok = Tokenizer.from_metadata(ollama)
    assert tok.vocabulary.add_space_prefix is False
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special=False) == ids
        assert tok.decode(ids) == text


def test_the_converter_refuses_a_split_it_would_not_reproduce(tmp_path: Path) -> None:
    gemma4_like(tmp_path)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "WhitespaceSplit"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ConvertError, match="pre-tokenizer"):
        tokenizer_metadata(tmp_path, HFConfig({}), vocab_size=1000)
    spec["pre_tokenizer"] = None
    prepend = {"type": "Prepend", "prepend": SPACE}  # Llama 2's dummy prefix: not Gemma 4's
    spec["normalizer"] = {"type": "Sequence", "normalizers": [prepend, spec["normalizer"]]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ConvertError, match="normalizer"):
        tokenizer_metadata(tmp_path, HFConfig({}), vocab_size=1000)


# ---------------------------------------------------------------- the reader, by hand

LETTERS = {"a": -100.0, "b": -101.0, "c": -102.0, SPACE: -103.0}


def encode_pieces(metadata: dict[str, Any], text: str) -> list[str]:
    return pieces_of(metadata, Tokenizer.from_metadata(metadata).encode(text, add_special=False))


def test_other_sentencepiece_files_ignore_merges_and_rank_by_score() -> None:
    metadata = spm_metadata({**LETTERS, "ab": -5.0, "bc": -1.0})
    assert encode_pieces(metadata, "abc") == ["a", "bc"]
    with_merges = {**metadata, "tokenizer.ggml.merges": ["a b"]}
    assert read_vocabulary(with_merges).merges == ()
    assert encode_pieces(with_merges, "abc") == ["a", "bc"]


def test_gemma4_files_use_their_merges() -> None:
    metadata = spm_metadata({**LETTERS, "ab": -5.0, "bc": -1.0}, pre="gemma4", merges=["a b"])
    assert read_vocabulary(metadata).merges == ("a b",)
    assert encode_pieces(metadata, "abc") == ["ab", "c"]
    later = {**metadata, "tokenizer.ggml.merges": ["b c", "a b"]}
    assert encode_pieces(later, "abc") == ["a", "bc"]


def test_gemma4_files_need_merges() -> None:
    metadata = spm_metadata(dict(LETTERS), pre="gemma4")
    with pytest.raises(VocabularyError, match=r"needs tokenizer\.ggml\.merges"):
        Tokenizer.from_metadata(metadata)
    bad = {**metadata, "tokenizer.ggml.merges": ["a b c"]}
    with pytest.raises(VocabularyError, match="not of the form"):
        Tokenizer.from_metadata(bad)


def test_the_dummy_prefix_default_depends_on_pre() -> None:
    plain = {k: v for k, v in spm_metadata(dict(LETTERS)).items() if "space_prefix" not in k}
    assert read_vocabulary(plain).add_space_prefix is True
    gemma4 = {**plain, "tokenizer.ggml.pre": "gemma4", "tokenizer.ggml.merges": []}
    assert read_vocabulary(gemma4).add_space_prefix is False
    assert encode_pieces(gemma4, "a") == ["a"]
    assert encode_pieces(plain, "a") == [SPACE, "a"]
    forced = {**gemma4, "tokenizer.ggml.add_space_prefix": True}
    assert read_vocabulary(forced).add_space_prefix is True


def test_a_gemma4_file_without_an_eot_ends_on_id_106_as_ollamas() -> None:
    pieces = {**LETTERS, **{f"p{i}": -200.0 - i for i in range(110)}}
    metadata = spm_metadata(pieces, pre="gemma4", merges=[]) | {
        "general.architecture": "gemma4", "tokenizer.ggml.eos_token_id": 1,
    }  # fmt: skip
    assert read_vocabulary(metadata).eos_ids == {1, 106}
    named = {**metadata, "tokenizer.ggml.eot_token_id": 7}
    assert read_vocabulary(named).eos_ids == {1, 7}
    assert read_vocabulary({**metadata, "general.architecture": "gemma3"}).eos_ids == {1}
