"""StreamDecoder: text out as soon as it is whole, never half a UTF-8 character."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_vocabs import spm_metadata

from ember.tokenizer import Tokenizer

# One token per byte: <0x00> is id 3 (after <unk> <s> </s>).
BYTES = Tokenizer.from_metadata(spm_metadata({"a": -1.0}))


def byte_ids(data: bytes) -> list[int]:
    return [3 + byte for byte in data]


def test_emoji_split_over_byte_tokens_comes_out_whole() -> None:
    stream = BYTES.stream_decoder()
    assert [stream.push(i) for i in byte_ids("🙂".encode())] == ["", "", "", "🙂"]
    assert stream.flush() == ""


def test_cjk_after_ascii() -> None:
    stream = BYTES.stream_decoder()
    pieces = [stream.push(i) for i in byte_ids("a語b".encode())]
    assert pieces == ["a", "", "", "語", "b"]


def test_unfinished_character_at_the_end_is_dropped() -> None:
    """As Ollama's flushPending: a reply cut inside an emoji ends before it, not with U+FFFD."""
    stream = BYTES.stream_decoder()
    assert stream.push(byte_ids(b"\xf0")[0]) == ""
    assert stream.push(byte_ids(b"\x9f")[0]) == ""
    assert stream.flush() == ""
    assert stream.push(byte_ids(b"x")[0]) == "x"  # flush starts over


def test_invalid_bytes_are_replaced_at_once() -> None:
    stream = BYTES.stream_decoder()
    assert stream.push(byte_ids(b"\xff")[0]) == "\ufffd"
    assert stream.push(byte_ids(b"\x80")[0]) == "\ufffd"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_stream_equals_decode_for_any_bytes(data: bytes) -> None:
    ids = byte_ids(data)
    stream = BYTES.stream_decoder()
    text = "".join(stream.push(i) for i in ids) + stream.flush()
    decoded = data.decode("utf-8", errors="replace")
    assert BYTES.decode(ids) == decoded
    # but for the first bytes of a character cut short at the end: decode's last U+FFFD
    assert text in (decoded, decoded.removesuffix("\ufffd"))


TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\ufffd"), max_size=30)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_stream_never_emits_half_a_character(text: str) -> None:
    stream = BYTES.stream_decoder()
    pieces = [stream.push(i) for i in byte_ids(text.encode())] + [stream.flush()]
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) == text
