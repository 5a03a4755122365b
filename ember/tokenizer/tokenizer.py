"""Text to token ids and back for a GGUF vocabulary (byte-level BPE, SentencePiece, WordPiece).

Encoding runs in HF `tokenizers`; BOS/EOS and decoding (from each token's bytes) are done here.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import gc
import logging
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from ember.tokenizer import bpe, spm, wordpiece
from ember.tokenizer.vocab import TokenizerError, TokenType, Vocabulary, read_vocabulary

log = logging.getLogger(__name__)


class Tokenizer:
    """Encodes text to ids and decodes ids to text, as llama.cpp and Ollama do for the file."""

    def __init__(self, vocab: Vocabulary, backend: HFTokenizer) -> None:
        self._vocab = vocab
        self._backend = backend
        self._types = vocab.types.tolist()
        self._bytes: list[bytes | None] = [None] * vocab.size
        spellers = {"gpt2": bpe.token_bytes, "bert": wordpiece.token_bytes}
        self._spell = spellers.get(vocab.model, spm.token_bytes)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (`tokenizer.ggml.*`, arrays as lists).

        Raises VocabularyError or UnsupportedTokenizerError (both TokenizerError).
        """
        vocab = read_vocabulary(metadata)
        with _gc_paused():
            builders = {"gpt2": bpe.build_bpe, "bert": wordpiece.build_wordpiece}
            # the build reads every token several times: decoded once for all of them, and
            # dropped after (the vocabulary kept stays packed where the file's was)
            unpacked = dataclasses.replace(vocab, tokens=tuple(vocab.tokens))
            backend = builders.get(vocab.model, spm.build_spm)(unpacked)
        return cls(vocab, backend)

    @property
    def vocabulary(self) -> Vocabulary:
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return self._vocab.size

    @property
    def bos_id(self) -> int | None:
        return self._vocab.bos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation."""
        return self._vocab.eos_ids

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        """Ids for `text`; control and user-defined tokens written in it are always recognised.

        `add_special` adds BOS/EOS where the vocabulary asks for them: pass True only for the
        first piece of a prompt that is encoded in parts.
        """
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        if not add_special:
            return ids
        vocab = self._vocab
        if vocab.add_bos and vocab.bos_id is not None:
            if ids and ids[0] == vocab.bos_id:
                log.warning("adding a BOS token to a prompt that already starts with one")
            ids.insert(0, vocab.bos_id)
        if vocab.add_eos and vocab.eos_id is not None:
            ids.append(vocab.eos_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; specials read as written, bytes that are not UTF-8 become U+FFFD."""
        data = b"".join(map(self.token_bytes, ids))
        # Undo the dummy "▁" SentencePiece put before the text (llama.cpp does the same).
        if (
            self._vocab.add_space_prefix
            and data.startswith(b" ")
            and self._types[operator.index(ids[0])] == TokenType.NORMAL
        ):
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, id: int) -> bytes:
        """The raw bytes one token stands for (possibly part of a UTF-8 character)."""
        index = operator.index(id)
        if not 0 <= index < self._vocab.size:
            raise TokenizerError(f"token id {index} is outside the vocabulary ({self.vocab_size})")
        cached = self._bytes[index]
        if cached is None:
            cached = self._spell(self._vocab.tokens[index], self._types[index])
            self._bytes[index] = cached
        return cached

    def is_special(self, id: int) -> bool:
        """Whether `id` is a control token (BOS, EOS, turn markers), not text."""
        index = operator.index(id)
        return 0 <= index < self._vocab.size and self._types[index] == TokenType.CONTROL

    def stream_decoder(self) -> StreamDecoder:
        """A decoder for ids that arrive one at a time (generation)."""
        return StreamDecoder(self.token_bytes)


class StreamDecoder:
    """Text from ids pushed one by one, never cutting a UTF-8 character in half.

    Its output concatenated equals `Tokenizer.decode` of the same ids, except that it keeps the
    SentencePiece dummy-prefix space (generated text continues a prompt) and drops a character
    cut short at the end (decode makes it U+FFFD).
    """

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        """The text that is complete once this token is added (may be empty)."""
        return self._utf8.decode(self._token_bytes(id))

    def flush(self) -> str:
        """What is left at the end: nothing, since only an incomplete character can be (its
        first bytes, held back) and it is dropped, as Ollama's flushPending drops trailing
        invalid UTF-8 (num_predict often ends generation inside an emoji)."""
        self._utf8.reset()
        return ""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Building allocates ~10^6 small tuples; the cyclic GC would rescan them over and over and
    # triple the build time of a large vocabulary.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
