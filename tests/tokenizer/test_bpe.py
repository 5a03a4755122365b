"""Byte-level BPE on tiny hand-written vocabularies: merges, specials, BOS/EOS, pre-tokenizers."""

from __future__ import annotations

import json
import logging

import pytest
from tokenizer_vocabs import CONTROL, USER_DEFINED, bpe_metadata, pieces_of

from ember.tokenizer import Tokenizer, TokenizerError
from ember.tokenizer.bpe import PRE_TOKENIZERS, byte_alphabet


def encode_pieces(metadata: dict, text: str, **kwargs: bool) -> list[str]:
    return pieces_of(metadata, Tokenizer.from_metadata(metadata).encode(text, **kwargs))


def test_byte_alphabet_is_gpt2s() -> None:
    alphabet = byte_alphabet()
    assert len(set(alphabet.values())) == 256
    assert alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ" and alphabet[ord("A")] == "A"
    assert alphabet[0xC3] == "Ã" and alphabet[0xAD] == "Ń"


def test_lower_ranked_merge_wins() -> None:
    assert encode_pieces(bpe_metadata([("a", "b"), ("b", "c")]), "abc") == ["ab", "c"]
    assert encode_pieces(bpe_metadata([("b", "c"), ("a", "b")]), "abc") == ["a", "bc"]


def test_merges_build_on_merges() -> None:
    metadata = bpe_metadata([("Ġ", "t"), ("h", "e"), ("Ġt", "he")])
    assert encode_pieces(metadata, " the the") == ["Ġthe", "Ġthe"]
    assert encode_pieces(metadata, "the") == ["t", "he"]


def test_gpt2_split_keeps_merges_inside_words() -> None:
    metadata = bpe_metadata([("a", "Ġ"), ("Ġ", "b")])
    assert encode_pieces(metadata, "a b") == ["a", "Ġb"]  # "a" and " b" are separate words


def test_specials_are_split_out_first_and_matched_literally() -> None:
    metadata = bpe_metadata(
        [("x", "<")], specials=(("<|im_start|>", CONTROL), ("<think>", USER_DEFINED))
    )
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode("x<|im_start|>y<think>z")
    assert pieces_of(metadata, ids) == ["x", "<|im_start|>", "y", "<think>", "z"]
    assert tok.encode("x<|im_start|>", add_special=False) == ids[:2]  # parsed without BOS too
    assert tok.is_special(ids[1]) and not tok.is_special(ids[3]) and not tok.is_special(ids[0])
    assert tok.decode(ids) == "x<|im_start|>y<think>z"


def test_longest_special_wins_at_the_leftmost_match() -> None:
    metadata = bpe_metadata([], specials=(("<|a|>", CONTROL), ("<|a|>b", CONTROL)))
    assert encode_pieces(metadata, "<|a|>bc<|a|>") == ["<|a|>b", "c", "<|a|>"]


def test_specials_outside_the_byte_alphabet_are_raw_text() -> None:
    eos = "<｜end▁of▁sentence｜>"
    metadata = bpe_metadata([], specials=(("  ", USER_DEFINED), (eos, CONTROL)))
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode(f"a  b{eos}")
    assert pieces_of(metadata, ids) == ["a", "  ", "b", eos]
    assert tok.token_bytes(ids[1]) == b"  " and tok.token_bytes(ids[3]) == eos.encode()
    assert tok.decode(ids) == f"a  b{eos}"


def test_bos_only_when_asked_and_only_on_the_first_piece() -> None:
    metadata = bpe_metadata(
        [("h", "i")], specials=(("<s>", CONTROL),), bos_token_id=257, add_bos_token=True
    )
    tok = Tokenizer.from_metadata(metadata)
    assert tok.encode("hi") == [257, 256]
    assert tok.encode("hi", add_special=False) == [256]
    # A prompt encoded in parts (text around an image): BOS on the first part only.
    parts = tok.encode("hi") + tok.encode("hi", add_special=False)
    assert parts == [257, 256, 256]


def test_eos_appended_when_the_file_asks() -> None:
    metadata = bpe_metadata([], specials=(("</s>", CONTROL),), eos_token_id=256, add_eos_token=True)
    tok = Tokenizer.from_metadata(metadata)
    assert pieces_of(metadata, tok.encode("a")) == ["a", "</s>"]
    assert pieces_of(metadata, tok.encode("a", add_special=False)) == ["a"]


def test_a_second_bos_is_added_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    metadata = bpe_metadata([], specials=(("<s>", CONTROL),), bos_token_id=256, add_bos_token=True)
    with caplog.at_level(logging.WARNING, logger="ember.tokenizer"):
        ids = Tokenizer.from_metadata(metadata).encode("<s>a")
    assert ids[:2] == [256, 256]
    assert "already starts with one" in caplog.text


def test_smollm_splits_digits_one_by_one() -> None:
    merges = [("1", "2"), ("Ġ", "1")]
    assert encode_pieces(bpe_metadata(merges, pre="smollm"), " 12") == ["Ġ", "1", "2"]
    assert encode_pieces(bpe_metadata(merges, pre="gpt2"), " 12") == ["Ġ", "12"]


def test_qwen2_splits_digits_and_llama3_groups_three() -> None:
    merges = [("1", "2"), ("12", "3")]
    assert encode_pieces(bpe_metadata(merges, pre="qwen2"), "1234") == ["1", "2", "3", "4"]
    assert encode_pieces(bpe_metadata(merges, pre="llama-bpe"), "1234") == ["123", "4"]
    assert encode_pieces(bpe_metadata(merges, pre="gpt2"), "1234") == ["123", "4"]


def test_llama3_takes_a_whole_word_that_is_a_token() -> None:
    # "abc" has no merges that reach it: only llama3's ignore_merges finds it.
    assert encode_pieces(bpe_metadata([], words=("abc",), pre="llama-bpe"), "abc") == ["abc"]
    assert encode_pieces(bpe_metadata([], words=("abc",), pre="qwen2"), "abc") == ["a", "b", "c"]


def test_qwen2_keeps_newlines_apart_from_words() -> None:
    metadata = bpe_metadata([("Ċ", "a"), ("Ġ", "a")], pre="qwen2")
    assert encode_pieces(metadata, "\na a") == ["Ċ", "a", "Ġa"]


def test_unknown_pre_tokenizer_falls_back_to_gpt2_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    merges = [("1", "2")]
    with caplog.at_level(logging.WARNING, logger="ember.tokenizer"):
        pieces = encode_pieces(bpe_metadata(merges, pre="made-up"), "12")
    assert pieces == ["12"]
    assert "unknown pre-tokenizer 'made-up'" in caplog.text


@pytest.mark.parametrize("name", ["default", "gpt2", "smollm", "llama-bpe", "qwen2", "tekken"])
def test_known_pre_tokenizers_build(name: str) -> None:
    assert name in PRE_TOKENIZERS
    tok = Tokenizer.from_metadata(bpe_metadata([("Ġ", "a")], pre=name))
    text = "It's 2024: a\tb  c\r\n日本 🙂"
    assert tok.decode(tok.encode(text)) == text


def test_token_bytes_undo_the_byte_alphabet() -> None:
    metadata = bpe_metadata([("Ã", "©"), ("Ġ", "c")])
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode(" café")
    assert pieces_of(metadata, ids) == ["Ġc", "a", "f", "Ã©"]
    assert [tok.token_bytes(i) for i in ids] == [b" c", b"a", b"f", "é".encode()]
    half = metadata["tokenizer.ggml.tokens"].index("Ã")
    assert tok.token_bytes(half) == b"\xc3"
    assert tok.decode([half]) == "\ufffd"


def test_ids_outside_the_vocabulary() -> None:
    tok = Tokenizer.from_metadata(bpe_metadata([]))
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.token_bytes(256)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([1, -1])
    assert not tok.is_special(10**6)


def test_empty_text() -> None:
    metadata = bpe_metadata([], specials=(("<s>", CONTROL),), bos_token_id=256, add_bos_token=True)
    tok = Tokenizer.from_metadata(metadata)
    assert tok.encode("", add_special=False) == []
    assert tok.encode("") == [256]
    assert tok.decode([]) == ""



# DeepSeek V3's split regexes as its tokenizer.json holds them (llama.cpp's and Ollama's
# deepseek-v3), decoded: the JSON's "\r\n" are the line-break characters themselves
DEEPSEEK3_REGEXES = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
DEEPSEEK3_PRE = {"type": "Sequence", "pretokenizers": [
    *({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
      for r in DEEPSEEK3_REGEXES),
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
]}  # fmt: skip
TEXTS = ["Hello, world! 1234567 apples", "日本語のテキストと中文混合abc", "x.y_z\n\n  tail\r\n",
         "naïve café — 'quoted' #tag @user 3.14159", "カタカナ and ひらがな 12"]  # fmt: skip


def test_deepseek_v3_splits_as_its_tokenizer_json() -> None:
    from tokenizers import Tokenizer as HFTokenizer

    from ember.tokenizer.bpe import _pre_tokenizer

    spec = {"version": "1.0", "pre_tokenizer": DEEPSEEK3_PRE,
            "model": {"type": "BPE", "vocab": {}, "merges": []}}  # fmt: skip
    theirs = HFTokenizer.from_str(json.dumps(spec)).pre_tokenizer
    ours = _pre_tokenizer(PRE_TOKENIZERS["deepseek-v3"])
    for text in TEXTS:
        assert ours.pre_tokenize_str(text) == theirs.pre_tokenize_str(text), text
    assert [w for w, _ in ours.pre_tokenize_str("1234567")] == ["123", "456", "7"]


@pytest.mark.parametrize("escaped", [False, True])
def test_the_converter_names_deepseek_v3s_split(escaped: bool) -> None:
    from ember.convert.vocab import _pre_tokenizer_name

    spec = json.loads(json.dumps({"pre_tokenizer": DEEPSEEK3_PRE, "model": {}}))
    if escaped:  # a file whose regex writes its line breaks as escapes
        for step in spec["pre_tokenizer"]["pretokenizers"][:-1]:
            regex = step["pattern"]["Regex"]
            step["pattern"]["Regex"] = regex.replace("\r", "\\r").replace("\n", "\\n")
    assert _pre_tokenizer_name(spec) == "deepseek-v3"
