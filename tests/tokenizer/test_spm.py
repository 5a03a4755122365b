"""SentencePiece on tiny hand-written vocabularies: score order, byte fallback, spaces, merges."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizer_vocabs import CONTROL, USER_DEFINED, pieces_of, spm_metadata

from ember.tokenizer import Tokenizer
from ember.tokenizer.spm import derive_merges
from ember.tokenizer.vocab import TokenType, read_vocabulary

LETTERS = {"a": -100.0, "b": -101.0, "c": -102.0, "▁": -103.0}


def encode_pieces(metadata: dict, text: str) -> list[str]:
    return pieces_of(metadata, Tokenizer.from_metadata(metadata).encode(text, add_special=False))


def test_highest_score_merges_first() -> None:
    metadata = spm_metadata({**LETTERS, "ab": -5.0, "bc": -1.0})
    assert encode_pieces(metadata, "abc") == ["a", "bc"]
    metadata = spm_metadata({**LETTERS, "ab": -1.0, "bc": -5.0})
    assert encode_pieces(metadata, "abc") == ["ab", "c"]


def test_a_low_score_piece_can_lead_to_a_high_one() -> None:
    # "abc" outranks "ab", but is reachable only through it.
    metadata = spm_metadata({**LETTERS, "abc": -1.0, "ab": -50.0})
    assert encode_pieces(metadata, "abcab") == ["abc", "ab"]


def test_same_piece_ties_go_to_the_leftmost_pair() -> None:
    metadata = spm_metadata({**LETTERS, "aa": -1.0})
    assert encode_pieces(metadata, "aaa") == ["aa", "a"]
    assert encode_pieces(metadata, "aaaaa") == ["aa", "aa", "a"]


def test_equal_scores_fall_back_to_the_lower_id() -> None:
    # Real vocabularies have distinct scores; where they do not, the file order decides, as in
    # transformers' GGUF loader (SentencePiece itself would take the leftmost pair here).
    metadata = spm_metadata({**LETTERS, "bc": -5.0, "ab": -5.0})
    assert encode_pieces(metadata, "abc") == ["a", "bc"]


def test_unknown_characters_fall_back_to_bytes() -> None:
    metadata = spm_metadata(LETTERS)
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode("aé🙂", add_special=False)
    assert pieces_of(metadata, ids) == [
        "a",
        "<0xC3>",
        "<0xA9>",
        "<0xF0>",
        "<0x9F>",
        "<0x99>",
        "<0x82>",
    ]
    assert tok.token_bytes(ids[1]) == b"\xc3"
    assert tok.decode(ids) == "aé🙂"


def test_without_byte_tokens_unknown_characters_are_unk() -> None:
    metadata = spm_metadata(LETTERS, byte_fallback=False)
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode("aéb", add_special=False)
    assert pieces_of(metadata, ids) == ["a", "<unk>", "b"]
    assert tok.decode(ids) == "a<unk>b"


def test_spaces_are_written_as_the_meta_space() -> None:
    metadata = spm_metadata({**LETTERS, "▁a": -1.0})
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode("a a  a", add_special=False)
    assert pieces_of(metadata, ids) == ["a", "▁a", "▁", "▁a"]
    assert tok.decode(ids) == "a a  a"


def test_user_defined_runs_of_spaces_match_before_the_meta_space() -> None:
    # Gemma stores "  " (two real spaces) as a user-defined token.
    metadata = spm_metadata({**LETTERS, "▁a": -1.0}, specials=(("  ", USER_DEFINED),))
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode(" a  a", add_special=False)
    assert pieces_of(metadata, ids) == ["▁a", "  ", "a"]
    assert tok.decode(ids) == " a  a"


def test_dummy_prefix_goes_before_the_text_and_after_each_special() -> None:
    metadata = spm_metadata(
        {**LETTERS, "▁a": -1.0}, specials=(("<sep>", USER_DEFINED),), add_space_prefix=True
    )
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode("a a<sep>a", add_special=False)
    assert pieces_of(metadata, ids) == ["▁a", "▁a", "<sep>", "▁a"]  # as llama.cpp
    # decode drops the dummy space of the first token only.
    assert tok.decode(ids) == "a a<sep> a"
    assert tok.decode(tok.encode("a a", add_special=False)) == "a a"
    assert tok.decode(tok.encode(" a", add_special=False)) == " a"


def test_bos_and_specials() -> None:
    metadata = spm_metadata(
        {**LETTERS, "▁a": -1.0}, specials=(("<turn>", CONTROL),), add_bos_token=True
    )
    tok = Tokenizer.from_metadata(metadata)
    ids = tok.encode("<turn>a a")
    assert pieces_of(metadata, ids) == ["<s>", "<turn>", "a", "▁a"]
    assert tok.is_special(ids[0]) and tok.is_special(ids[1]) and not tok.is_special(ids[2])
    assert tok.decode(ids) == "<s><turn>a a"


def brute_force_merges(tokens: list[str], types: list[int], scores: list[float]) -> list:
    normal = {t: i for i, t in enumerate(tokens) if types[i] == TokenType.NORMAL}
    by_priority = sorted(normal, key=lambda t: (-scores[normal[t]], normal[t]))
    return [
        (piece[:cut], piece[cut:])
        for piece in by_priority
        for cut in range(len(piece) - 1, 0, -1)
        if piece[:cut] in normal and piece[cut:] in normal
    ]


def random_vocabulary(seed: int) -> dict:
    rng = random.Random(seed)
    alphabet = "ab▁é日🙂"
    pieces: dict[str, float] = {c: -1000.0 - i for i, c in enumerate(alphabet)}
    while len(pieces) < 300:
        piece = "".join(rng.choice(alphabet) for _ in range(rng.choice([2, 3, 4, 5])))
        pieces.setdefault(piece, rng.random())
    while len(pieces) < 400:  # joins of pieces, up to ~60 long: the hashed and the plain path
        joined = "".join(rng.sample(sorted(pieces), 2))
        pieces.setdefault(joined if len(joined) > 6 else joined * 7, rng.random())
    for piece in rng.sample(sorted(pieces), 5):
        pieces[piece] = 0.5  # a few equal scores
    return spm_metadata(pieces, specials=(("ab", CONTROL),))


@pytest.mark.parametrize("seed", range(4))
def test_derived_merges_equal_brute_force(seed: int) -> None:
    metadata = random_vocabulary(seed)
    vocab = read_vocabulary(metadata)
    expected = brute_force_merges(
        metadata["tokenizer.ggml.tokens"],
        metadata["tokenizer.ggml.token_type"],
        metadata["tokenizer.ggml.scores"],
    )
    assert derive_merges(vocab) == expected
    lengths = [len(left + right) for left, right in expected]
    assert min(lengths) == 2 and max(lengths) > 32  # both search paths were used


def test_derived_merges_skip_control_and_byte_tokens() -> None:
    metadata = spm_metadata({**LETTERS, "<s>a": -1.0}, specials=(("ab", CONTROL),))
    vocab = read_vocabulary(metadata)
    merges = derive_merges(vocab)
    assert ("a", "b") not in merges  # "ab" is a control token: never formed by merging
    assert all(not left.startswith("<0x") for left, _ in merges)
    assert np.all(vocab.types[[1, 2]] == TokenType.CONTROL)
