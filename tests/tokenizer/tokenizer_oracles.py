"""Oracles built apart from Ember's tokenizer: the sentencepiece library for SentencePiece
vocabularies, and a plain-Python byte-level BPE that follows llama.cpp's algorithm."""

from __future__ import annotations

import itertools
from typing import Any

import regex

from ember.tokenizer.bpe import PRE_TOKENIZERS, byte_alphabet
from ember.tokenizer.vocab import TokenType

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp applies these one after the other; text between matches stays a piece of its own.
# The multi-split ones take Ember's regexes (llama.cpp's, copied from its llama-vocab.cpp) to
# check their meaning under another regex engine, and this file's split loop.
LLAMA_CPP_SPLITS = {"gpt2": [GPT2], "smollm": [r"\p{N}", GPT2], "qwen2": [QWEN2]} | {
    name: [*PRE_TOKENIZERS[name].first, str(PRE_TOKENIZERS[name].regex)]
    for name in ("deepseek-llm", "deepseek-coder", "deepseek-v3", "glm4", "laguna")
}


def sentencepiece_for(metadata: dict[str, Any]) -> Any:
    """A real SentencePiece BPE processor over the file's pieces, scores and types.

    Whitespace-only user-defined tokens are stored with spaces in GGUF; SentencePiece matches
    them after escaping spaces, so they are written back as "▁" runs here.
    """
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    kind = model_pb2.ModelProto.SentencePiece.Type
    kinds = {
        1: kind.NORMAL,
        2: kind.UNKNOWN,
        3: kind.CONTROL,
        4: kind.USER_DEFINED,
        5: kind.UNUSED,
        6: kind.BYTE,
    }
    tokens = metadata["tokenizer.ggml.tokens"]
    for piece, score, token_type in zip(
        tokens,
        metadata["tokenizer.ggml.scores"],
        metadata["tokenizer.ggml.token_type"],
        strict=True,
    ):
        if token_type == TokenType.USER_DEFINED and not piece.strip(" "):
            piece = "\u2581" * len(piece)
        entry = proto.pieces.add()
        entry.piece, entry.score, entry.type = piece, score, kinds[token_type]
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id = metadata["tokenizer.ggml.unknown_token_id"]
    proto.trainer_spec.bos_id = metadata["tokenizer.ggml.bos_token_id"]
    proto.trainer_spec.eos_id = metadata["tokenizer.ggml.eos_token_id"]
    proto.trainer_spec.pad_id = metadata.get("tokenizer.ggml.padding_token_id", -1)
    spec = proto.normalizer_spec
    spec.name, spec.add_dummy_prefix = "identity", False
    spec.remove_extra_whitespaces, spec.escape_whitespaces = False, True
    return sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())


class ByteLevelBPE:
    """llama.cpp's byte-level BPE in plain Python: specials, regex splits, ranked merges."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        tokens = metadata["tokenizer.ggml.tokens"]
        types = metadata["tokenizer.ggml.token_type"]
        self.ids = {}
        for i, token in enumerate(tokens):
            self.ids.setdefault(token, i)
        self.ranks = {
            tuple(merge.split(" ")): rank
            for rank, merge in enumerate(metadata["tokenizer.ggml.merges"])
        }
        self.specials = sorted(
            (t for t, kind in zip(tokens, types, strict=True) if kind in (3, 4)),
            key=len,
            reverse=True,
        )
        self.splits = LLAMA_CPP_SPLITS[metadata["tokenizer.ggml.pre"]]
        self.alphabet = byte_alphabet()

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for fragment, is_special in self._fragments(text):
            if is_special:
                ids.append(self.ids[fragment])
                continue
            for word in self._words(fragment):
                spelled = "".join(self.alphabet[b] for b in word.encode())
                for symbol in self._merge(spelled):
                    ids += self._lookup(symbol)
        return ids

    def _fragments(self, text: str) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        start = pos = 0
        while pos < len(text):
            found = next((s for s in self.specials if text.startswith(s, pos)), None)
            if found is None:
                pos += 1
                continue
            if pos > start:
                out.append((text[start:pos], False))
            out.append((found, True))
            pos = start = pos + len(found)
        if start < len(text):
            out.append((text[start:], False))
        return out

    def _words(self, fragment: str) -> list[str]:
        pieces = [fragment]
        for pattern in self.splits:
            split: list[str] = []
            for piece in pieces:
                last = 0
                for match in regex.finditer(pattern, piece):
                    if match.start() > last:
                        split.append(piece[last : match.start()])
                    split.append(match.group())
                    last = match.end()
                if last < len(piece):
                    split.append(piece[last:])
            pieces = split
        return pieces

    def _merge(self, word: str) -> list[str]:
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [
                (self.ranks.get((a, b), len(self.ranks)), i)
                for i, (a, b) in enumerate(itertools.pairwise(symbols))
            ]
            rank, i = min(ranked)
            if rank == len(self.ranks):
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        return symbols

    def _lookup(self, symbol: str) -> list[int]:
        if symbol in self.ids:
            return [self.ids[symbol]]
        return [self.ids[c] for c in symbol if c in self.ids]  # bytes missing from the vocab drop
