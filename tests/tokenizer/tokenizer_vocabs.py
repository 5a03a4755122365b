"""Tiny GGUF tokenizer metadata dicts, written by hand, for the synthetic tokenizer tests."""

from __future__ import annotations

from typing import Any

from ember.tokenizer.bpe import byte_alphabet
from ember.tokenizer.vocab import TokenType

NORMAL, CONTROL, USER_DEFINED, BYTE = (
    TokenType.NORMAL,
    TokenType.CONTROL,
    TokenType.USER_DEFINED,
    TokenType.BYTE,
)


def bpe_metadata(
    merges: list[tuple[str, str]],
    *,
    words: tuple[str, ...] = (),
    specials: tuple[tuple[str, int], ...] = (),
    pre: str = "gpt2",
    **keys: Any,
) -> dict[str, Any]:
    """A byte-level vocabulary: the 256 byte characters, the merge results, `words`, `specials`.

    Merges and words are spelled in the byte alphabet ("Ġ" for a space). Extra keyword arguments
    become `tokenizer.ggml.<name>` keys.
    """
    tokens = list(byte_alphabet().values())
    for left, right in merges:
        if left + right not in tokens:
            tokens.append(left + right)
    tokens += [word for word in words if word not in tokens]
    types = [NORMAL] * len(tokens)
    for text, token_type in specials:
        tokens.append(text)
        types.append(token_type)
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [int(t) for t in types],
        "tokenizer.ggml.merges": [f"{left} {right}" for left, right in merges],
    }
    metadata.update({f"tokenizer.ggml.{name}": value for name, value in keys.items()})
    return metadata


def spm_metadata(
    pieces: dict[str, float],
    *,
    specials: tuple[tuple[str, int], ...] = (),
    byte_fallback: bool = True,
    **keys: Any,
) -> dict[str, Any]:
    """A SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, `pieces` (piece: score).

    `add_space_prefix` defaults to False here (as Gemma); pass it to test the dummy prefix.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, CONTROL, CONTROL]
    scores = [0.0, 0.0, 0.0]
    if byte_fallback:
        tokens += [f"<0x{byte:02X}>" for byte in range(256)]
        types += [BYTE] * 256
        scores += [0.0] * 256
    for piece, score in pieces.items():
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(score)
    for text, token_type in specials:
        tokens.append(text)
        types.append(token_type)
        scores.append(0.0)
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [int(t) for t in types],
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": False,
    }
    metadata.update({f"tokenizer.ggml.{name}": value for name, value in keys.items()})
    return metadata


def pieces_of(metadata: dict[str, Any], ids: list[int]) -> list[str]:
    """The token texts of `ids`, to write expectations readably."""
    tokens = metadata["tokenizer.ggml.tokens"]
    return [tokens[i] for i in ids]
