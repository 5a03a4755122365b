"""Tokenizers built from a GGUF vocabulary: byte-level BPE, SentencePiece and WordPiece (BERT)."""

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
