"""Reading GGUF tokenizer metadata: what is accepted, the errors for what is not, BOS/EOS ids."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from tokenizer_vocabs import CONTROL, NORMAL, bpe_metadata, spm_metadata

from ember.errors import EmberError
from ember.tokenizer import (
    Tokenizer,
    TokenizerError,
    UnsupportedTokenizerError,
    VocabularyError,
)


def small_bpe(**keys: Any) -> dict[str, Any]:
    return bpe_metadata(
        [("h", "i")], specials=(("<s>", CONTROL), ("</s>", CONTROL), ("<eot>", CONTROL)), **keys
    )


def with_key(metadata: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    return {**metadata, f"tokenizer.ggml.{name}": value}


def without_key(metadata: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if k != f"tokenizer.ggml.{name}"}


def test_errors_are_ember_errors() -> None:
    assert issubclass(VocabularyError, TokenizerError)
    assert issubclass(UnsupportedTokenizerError, TokenizerError)
    assert issubclass(TokenizerError, EmberError)


def test_no_tokenizer_model_is_a_vocabulary_error() -> None:
    with pytest.raises(VocabularyError, match="no tokenizer"):
        Tokenizer.from_metadata(without_key(small_bpe(), "model"))


@pytest.mark.parametrize("model", ["t5", "rwkv", "no_vocab"])
def test_unsupported_model_names_the_supported_ones(model: str) -> None:
    with pytest.raises(UnsupportedTokenizerError, match="gpt2, llama, bert"):
        Tokenizer.from_metadata(with_key(small_bpe(), "model", model))


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("tokens", None, "tokens is missing"),
        ("tokens", "abc", "tokens is missing"),
        ("tokens", [], "empty"),
        ("tokens", ["a", 1, "b"], "not a string"),
        ("token_type", [1, 1], "entries for"),
        ("token_type", ["x"] * 3, "not a list of numbers"),
        ("bos_token_id", 10_000, "outside the vocabulary"),
        ("bos_token_id", -1, "outside the vocabulary"),
        ("bos_token_id", "1", "should be an integer"),
        ("add_bos_token", "yes", "should be true or false"),
        ("pre", 3, "should be a string"),
        ("eos_token_ids", [1, 99_999], "outside the vocabulary"),
        ("eos_token_ids", ["1"], "not a list of integers"),
        ("eos_token_ids", 5, "not a list of integers"),
        ("merges", None, "needs tokenizer.ggml.merges"),
        ("merges", ["h i j"], "not of the form"),
        ("merges", ["hi"], "not of the form"),
        ("merges", ["q z", "x y"], "do not fit"),  # results "qz", "xy" are not tokens
    ],
)
def test_bad_metadata_raises_vocabulary_error(name: str, value: Any, message: str) -> None:
    metadata = small_bpe()
    metadata = without_key(metadata, name) if value is None else with_key(metadata, name, value)
    with pytest.raises(VocabularyError, match=message):
        Tokenizer.from_metadata(metadata)


def test_add_bos_without_bos_id_is_an_error() -> None:
    with pytest.raises(VocabularyError, match="no bos_token_id"):
        Tokenizer.from_metadata(small_bpe(add_bos_token=True))


def test_add_eos_without_eos_id_is_an_error() -> None:
    with pytest.raises(VocabularyError, match="no eos_token_id"):
        Tokenizer.from_metadata(small_bpe(add_eos_token=True))


def test_bos_and_eos_ids_come_from_the_file() -> None:
    metadata = small_bpe(bos_token_id=256 + 1, eos_token_id=256 + 2, eos_token_ids=[256 + 3])
    tok = Tokenizer.from_metadata(metadata)
    assert tok.bos_id == 257
    assert tok.eos_ids == frozenset({258, 259})
    assert tok.vocab_size == 260


def test_eot_token_id_also_ends_generation() -> None:
    tok = Tokenizer.from_metadata(small_bpe(eos_token_id=258, eot_token_id=259))
    assert tok.eos_ids == frozenset({258, 259})


def test_harmony_ends_on_return_and_call_not_end() -> None:
    # gpt-oss: a file made by llama.cpp's converter names <|return|> and <|end|> (eot); the
    # answer continues after <|end|> (the analysis ends there), and a tool call ends on <|call|>
    specials = tuple((s, CONTROL) for s in ("<|return|>", "<|end|>", "<|call|>", "<|start|>"))
    metadata = bpe_metadata([("h", "i")], specials=specials)
    ret, end, call = 257, 258, 259
    tok = Tokenizer.from_metadata({**metadata, **keys(eos_token_id=ret, eot_token_id=end)})
    assert tok.eos_ids == frozenset({ret, call})
    without_call = bpe_metadata([("h", "i")], specials=specials[:2])  # not Harmony's vocabulary
    tok = Tokenizer.from_metadata({**without_call, **keys(eos_token_id=ret, eot_token_id=end)})
    assert tok.eos_ids == frozenset({ret, end})


def test_end_of_text_and_fim_separators_end_generation_when_control() -> None:
    """As llama.cpp ends it (and Ollama runs qwen2 there): Qwen2.5-Coder's fill-in-the-middle
    answer ends on <|endoftext|>, which its file names only as padding."""
    specials = (
        ("<|im_end|>", CONTROL),
        ("<|endoftext|>", CONTROL),
        ("<|file_sep|>", CONTROL),
        ("<|fim_pad|>", NORMAL),  # not a control token: text
    )
    metadata = bpe_metadata([("h", "i")], specials=specials)
    im_end, end_of_text, file_sep, _ = (
        metadata["tokenizer.ggml.tokens"].index(text) for text, _ in specials
    )
    ids = keys(eos_token_id=im_end, padding_token_id=end_of_text)
    tok = Tokenizer.from_metadata({**metadata, **ids})
    assert tok.eos_ids == frozenset({im_end, end_of_text, file_sep})


def keys(**values: int) -> dict[str, int]:
    return {f"tokenizer.ggml.{k}": v for k, v in values.items()}


def test_gemma_adds_end_of_turn_to_the_stop_ids() -> None:
    metadata = spm_metadata({"a": -1.0}, specials=(("<end_of_turn>", CONTROL),))
    eot = len(metadata["tokenizer.ggml.tokens"]) - 1
    assert Tokenizer.from_metadata(metadata).eos_ids == frozenset({2})
    gemma = {**metadata, "general.architecture": "gemma3"}
    assert Tokenizer.from_metadata(gemma).eos_ids == frozenset({2, eot})


def test_missing_flags_take_llama_cpp_defaults() -> None:
    bpe = Tokenizer.from_metadata(small_bpe(bos_token_id=257))
    assert bpe.encode("hi") == [256]  # byte-level BPE adds no BOS unless told to
    pieces = {"▁a": -1.0, "▁": -2.0, "a": -3.0}
    spm = Tokenizer.from_metadata(without_key(spm_metadata(pieces), "add_space_prefix"))
    assert spm.encode("a") == [1, 3 + 256]  # SentencePiece: BOS and the dummy "▁" prefix


def test_no_token_types_means_all_normal() -> None:
    metadata = without_key(small_bpe(), "token_type")
    tok = Tokenizer.from_metadata(metadata)
    assert not tok.is_special(257)
    assert tok.encode("<s>") == [ord("<") - 33, ord("s") - 33, ord(">") - 33]


def test_numpy_arrays_are_accepted_as_metadata() -> None:
    np = pytest.importorskip("numpy")
    metadata = small_bpe(eos_token_id=np.uint32(258), eos_token_ids=np.array([259], np.int32))
    metadata["tokenizer.ggml.token_type"] = np.array(metadata["tokenizer.ggml.token_type"])
    tok = Tokenizer.from_metadata(metadata)
    assert tok.eos_ids == frozenset({258, 259})


def test_building_leaves_the_garbage_collector_on() -> None:
    assert gc.isenabled()
    Tokenizer.from_metadata(small_bpe())
    assert gc.isenabled()
