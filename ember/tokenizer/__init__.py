"""Tokenizers built from a GGUF vocabulary: byte-level BPE and SentencePiece."""

from ember.tokenizer.tokenizer import StreamDecoder, Tokenizer
from ember.tokenizer.vocab import (
    TokenizerError,
    TokenType,
    UnsupportedTokenizerError,
    Vocabulary,
    VocabularyError,
)

__all__ = [
    "StreamDecoder",
    "TokenType",
    "Tokenizer",
    "TokenizerError",
    "UnsupportedTokenizerError",
    "Vocabulary",
    "VocabularyError",
]
