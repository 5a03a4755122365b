"""The vocabulary a GGUF file describes, read and validated from its `tokenizer.ggml.*` metadata.

Only reads and checks values; the encoders that use it live in `bpe.py` and `spm.py`.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf.packed import PackedStrings

SUPPORTED_MODELS = ("gpt2", "llama", "bert")
# A SentencePiece-style BPE (Gemma 4): "▁" for spaces and byte fallback, as `llama`, but encoded
# with the file's merges (tokenizer.json's) and no dummy prefix, as Ollama's engine reads it.
SPM_BPE_PRE = "gemma4"

# Ollama adds Gemma's end-of-turn marker to the stop ids even where the file does not list it.
_GEMMA_END_OF_TURN = "<end_of_turn>"
# and Gemma 4's end of turn, by id where the file names no eot token (Ollama's default)
_GEMMA4_END_OF_TURN = 106


class TokenizerError(EmberError):
    """A tokenizer could not be built or used."""


class VocabularyError(TokenizerError, ValueError):
    """The file's vocabulary is missing, malformed or inconsistent."""


class UnsupportedTokenizerError(TokenizerError):
    """The file names a tokenizer model Ember does not implement."""


class TokenType(enum.IntEnum):
    """`tokenizer.ggml.token_type` values, as llama.cpp writes them."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True, slots=True, eq=False)
class Vocabulary:
    """Everything a tokenizer needs from the file, checked for consistency."""

    model: str  # "gpt2" (byte-level BPE), "llama" (SentencePiece) or "bert" (WordPiece)
    pre: str  # pre-tokenizer name (byte-level BPE only)
    tokens: Sequence[str]  # a tuple, or the file's packed strings (each decoded when read)
    types: np.ndarray  # (V,) int8 TokenType
    scores: np.ndarray | None  # (V,) float32; SentencePiece merge priorities
    merges: tuple[str, ...]  # "left right" pairs, best first (byte-level BPE and SPM_BPE_PRE)
    bos_id: int | None
    eos_id: int | None  # the one appended when add_eos
    eos_ids: frozenset[int]  # every id that ends generation
    unknown_id: int | None
    padding_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool

    @property
    def size(self) -> int:
        return len(self.tokens)

    def special_ids(self) -> np.ndarray:
        """Ids matched literally in text before encoding: control and user-defined tokens."""
        is_special = (self.types == TokenType.CONTROL) | (self.types == TokenType.USER_DEFINED)
        return np.flatnonzero(is_special)


def read_vocabulary(metadata: Mapping[str, Any]) -> Vocabulary:
    """Read and validate the `tokenizer.ggml.*` keys of a GGUF metadata mapping."""
    model = _get(metadata, "model", str)
    if model is None:
        raise VocabularyError("the model file has no tokenizer (tokenizer.ggml.model is missing)")
    if model not in SUPPORTED_MODELS:
        raise UnsupportedTokenizerError(
            f"tokenizer model {model!r} is not supported (supported: {', '.join(SUPPORTED_MODELS)})"
        )
    tokens = _read_tokens(metadata)
    types = _read_array(metadata, "token_type", len(tokens), np.int8)
    if types is None:
        types = np.full(len(tokens), TokenType.NORMAL, np.int8)
    scores = _read_array(metadata, "scores", len(tokens), np.float32)
    pre = str(_get(metadata, "pre", str, default="default"))
    is_spm, is_bert = model == "llama", model == "bert"
    # other SentencePiece files have no merges: spm.py derives them from the scores
    is_spm_bpe = is_spm and pre == SPM_BPE_PRE
    merges = _read_merges(metadata) if model == "gpt2" or is_spm_bpe else ()
    if is_spm_bpe:
        types = _typed_bytes(tokens, types)
    bos_id = _read_id(metadata, "bos_token_id", len(tokens))
    eos_id = _read_id(metadata, "eos_token_id", len(tokens))
    if is_bert:  # [CLS] text [SEP], as llama.cpp's WPM vocabulary
        bos_id = _read_id(metadata, "cls_token_id", len(tokens))
        eos_id = _read_id(metadata, "seperator_token_id", len(tokens))
    # (Ollama's engine reads a Gemma 4 file without the key as adding none)
    adds_bos = (is_spm and not is_spm_bpe) or is_bert
    add_bos = bool(_get(metadata, "add_bos_token", bool, default=adds_bos))
    if add_bos and bos_id is None:
        raise VocabularyError("tokenizer.ggml.add_bos_token is set but there is no bos_token_id")
    add_eos = bool(_get(metadata, "add_eos_token", bool, default=is_bert))
    eos_ids = _read_eos_ids(metadata, tokens, types)
    if add_eos and eos_id is None:
        raise VocabularyError("tokenizer.ggml.add_eos_token is set but there is no eos_token_id")
    return Vocabulary(
        model=model,
        pre=pre,
        tokens=tokens,
        types=types,
        scores=scores,
        merges=merges,
        bos_id=bos_id,
        eos_id=eos_id,
        eos_ids=eos_ids,
        unknown_id=_read_id(metadata, "unknown_token_id", len(tokens)),
        padding_id=_read_id(metadata, "padding_token_id", len(tokens)),
        add_bos=add_bos,
        add_eos=add_eos,
        # llama.cpp adds the SentencePiece dummy prefix unless the file says otherwise; Ollama's
        # engine never adds one for Gemma 4.
        add_space_prefix=(
            is_spm and bool(_get(metadata, "add_space_prefix", bool, default=not is_spm_bpe))
        )
        or is_bert,  # WordPiece's "▁" word starts: the first one is no space
    )


def _get(metadata: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """The value of `tokenizer.ggml.<name>` if it has the right kind, else a VocabularyError."""
    key = f"tokenizer.ggml.{name}"
    value = metadata.get(key, default)
    if value is None:
        return None
    if kind is str and isinstance(value, str):
        return value
    # GGUF stores flags as bool and ids as any integer width; numpy scalars count too.
    if kind is bool and isinstance(value, (bool, np.bool_)):
        return bool(value)
    if kind is int and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    expected = {str: "a string", bool: "true or false", int: "an integer"}[kind]
    raise VocabularyError(f"{key} should be {expected}, got {type(value).__name__}")


def _read_tokens(metadata: Mapping[str, Any]) -> Sequence[str]:
    raw = metadata.get("tokenizer.ggml.tokens")
    if isinstance(raw, PackedStrings):
        # kept packed: as Python strings Gemma 3's 262,144 took ~27 MB for a whole process
        # that reads a few (a token's bytes are cached once read; the builds read all once)
        if not len(raw):
            raise VocabularyError("tokenizer.ggml.tokens is empty")
        return raw
    if raw is None or isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence | np.ndarray):
        raise VocabularyError("tokenizer.ggml.tokens is missing or is not a list of strings")
    tokens = tuple(raw)
    if not tokens:
        raise VocabularyError("tokenizer.ggml.tokens is empty")
    if set(map(type, tokens)) != {str}:
        raise VocabularyError("tokenizer.ggml.tokens holds a value that is not a string")
    return tokens


def _read_array(
    metadata: Mapping[str, Any], name: str, length: int, dtype: type
) -> np.ndarray | None:
    raw = metadata.get(f"tokenizer.ggml.{name}")
    if raw is None:
        return None
    try:
        array: np.ndarray = np.asarray(raw, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise VocabularyError(f"tokenizer.ggml.{name} is not a list of numbers") from err
    if array.shape != (length,):
        raise VocabularyError(f"tokenizer.ggml.{name} has {array.size} entries for {length} tokens")
    return array


def _read_merges(metadata: Mapping[str, Any]) -> tuple[str, ...]:
    raw = metadata.get("tokenizer.ggml.merges")
    if raw is None:
        raise VocabularyError("a BPE vocabulary needs tokenizer.ggml.merges")
    merges = tuple(raw)
    if not all(isinstance(merge, str) for merge in merges):
        raise VocabularyError("tokenizer.ggml.merges holds a value that is not a string")
    return merges


def _typed_bytes(tokens: Sequence[str], types: np.ndarray) -> np.ndarray:
    """`types` with every normal `<0xHH>` piece a byte token: Ollama's engine reads any such
    piece as its byte, and its converter writes them as normal; Ember's decoder reads only
    byte tokens so."""
    found = [i for i in _byte_piece_ids(tokens) if types[i] == TokenType.NORMAL]
    if not found:
        return types
    types = types.copy()
    types[found] = TokenType.BYTE
    return types


def _byte_piece_ids(tokens: Sequence[str]) -> list[int]:
    """The ids of the pieces `<0x00>`..`<0xFF>`: usually one run (found without reading the
    whole vocabulary, which may be kept packed), else looked for one by one."""
    names = [f"<0x{byte:02X}>" for byte in range(256)]
    with contextlib.suppress(ValueError):
        first = tokens.index(names[0])
        if list(tokens[first : first + 256]) == names:
            return list(range(first, first + 256))
    wanted = set(names)
    return [i for i, token in enumerate(tokens) if token in wanted]


def _read_id(metadata: Mapping[str, Any], name: str, size: int) -> int | None:
    value = _get(metadata, name, int)
    if value is None:
        return None
    if not 0 <= value < size:
        raise VocabularyError(f"tokenizer.ggml.{name} = {value} is outside the vocabulary")
    return int(value)


def _read_eos_ids(
    metadata: Mapping[str, Any], tokens: Sequence[str], types: np.ndarray
) -> frozenset[int]:
    """Every id that ends generation: the file's, and those llama.cpp and Ollama add by text."""
    ids: set[int] = set()
    eos_id = _read_id(metadata, "eos_token_id", len(tokens))
    if eos_id is not None:
        ids.add(eos_id)
    eot_id = _read_id(metadata, "eot_token_id", len(tokens))
    if eot_id is None and metadata.get("general.architecture") == "gemma4":
        eot_id = _GEMMA4_END_OF_TURN if len(tokens) > _GEMMA4_END_OF_TURN else None
    if eot_id is not None:
        ids.add(eot_id)
    raw = metadata.get("tokenizer.ggml.eos_token_ids")
    if raw is not None:
        if (
            not isinstance(raw, Sequence | np.ndarray)
            or isinstance(raw, str)
            or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in raw)
        ):
            raise VocabularyError("tokenizer.ggml.eos_token_ids is not a list of integers")
        if any(not 0 <= i < len(tokens) for i in raw):
            raise VocabularyError("tokenizer.ggml.eos_token_ids has an id outside the vocabulary")
        ids.update(int(i) for i in raw)
    architecture = metadata.get("general.architecture")
    if isinstance(architecture, str) and architecture.startswith("gemma"):
        with contextlib.suppress(ValueError):
            ids.add(tokens.index(_GEMMA_END_OF_TURN))
    ids.update(_control_ends(tokens, types))
    ids.update(_harmony_ends(tokens, ids))
    return frozenset(ids)


# Control tokens that end generation by their text alone, as llama.cpp's vocabulary ends it
# whatever the file's ids say (its issue 9606), and Ollama runs qwen2's files on llama.cpp:
# Qwen2.5-Coder's fill-in-the-middle ends with <|endoftext|> (the file's padding id; its eos is
# <|im_end|>) or a FIM separator, which would otherwise be sampled past and shown as text.
_CONTROL_ENDS = frozenset({"<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"})


def _control_ends(tokens: Sequence[str], types: np.ndarray) -> set[int]:
    control = np.flatnonzero(types == TokenType.CONTROL)
    return {int(i) for i in control if tokens[int(i)] in _CONTROL_ENDS}


def _harmony_ends(tokens: Sequence[str], ids: set[int]) -> set[int]:
    """Harmony's (gpt-oss's) ends of generation: an answer (<|return|>) and a tool call
    (<|call|>), whatever the file lists; <|end|> only ends one message (the analysis), so it
    is taken out of ids, as llama.cpp does."""
    try:
        ends = {tokens.index("<|return|>"), tokens.index("<|call|>")}
    except ValueError:
        return set()
    with contextlib.suppress(ValueError):
        ids.discard(tokens.index("<|end|>"))
    return ends
