"""SentencePiece BPE (`tokenizer.ggml.model = llama`) as a HF `tokenizers` BPE with byte fallback.

The file has no merges, so they are derived from the vocabulary: every split of a normal piece in
two pieces, ranked by the piece's score, highest first as in SentencePiece (equal scores: lower id).
A file that has them (Gemma 4's, `tokenizer.ggml.pre = gemma4`) is encoded with its own merges.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, models, normalizers

from ember.tokenizer.bpe import special_tokens
from ember.tokenizer.vocab import TokenType, Vocabulary, VocabularyError

SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space
_MAX_HASHED_LEN = 32  # longer pieces (rare) are split in plain Python
# Odd 64-bit multipliers: the polynomial hash base, and the mixer that spreads hashes over buckets.
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)

Splits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # target, cut, left, right


def build_spm(vocab: Vocabulary) -> Tokenizer:
    """A HF tokenizer that encodes text without BOS/EOS; specials are added tokens."""
    ids = dict(zip(reversed(vocab.tokens), range(vocab.size - 1, -1, -1), strict=True))
    has_bytes = all(f"<0x{byte:02X}>" in ids for byte in range(256))
    unknown = vocab.tokens[vocab.unknown_id] if vocab.unknown_id is not None else None
    try:
        model = models.BPE(
            vocab=ids,
            merges=_file_merges(vocab.merges) if vocab.merges else derive_merges(vocab),
            byte_fallback=has_bytes,
            unk_token=unknown,
            fuse_unk=True,
        )
    except Exception as err:  # tokenizers raises plain Exceptions
        raise VocabularyError(f"cannot build the SentencePiece model: {err}") from err
    tokenizer = Tokenizer(model)
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if vocab.add_space_prefix:
        # Normalizers run on each stretch of text between specials: a "▁" before each, as llama.cpp.
        steps.insert(0, normalizers.Prepend(SPACE))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.add_special_tokens(special_tokens(vocab))
    return tokenizer


def token_bytes(token: str, token_type: int) -> bytes:
    """The bytes a SentencePiece token stands for: `<0xHH>` is one byte, `▁` a space."""
    if token_type == TokenType.BYTE and len(token) == 6 and token.startswith("<0x"):
        try:
            return bytes((int(token[3:5], 16),))
        except ValueError:
            pass
    if token_type in (TokenType.CONTROL, TokenType.USER_DEFINED):
        return token.encode()
    return token.replace(SPACE, " ").encode()


def _file_merges(merges: tuple[str, ...]) -> list[tuple[str, str]]:
    """The file's "left right" merges as pairs, best first."""
    pairs = []
    for merge in merges:
        left, space, right = merge.partition(" ")
        if not space or " " in right:
            raise VocabularyError("a merge is not of the form 'left right'")
        pairs.append((left, right))
    return pairs


def derive_merges(vocab: Vocabulary) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a normal piece, best piece first.

    For one piece, the split with the longer left part comes first (as transformers orders them).
    """
    normal = np.flatnonzero(vocab.types == TokenType.NORMAL)
    pieces = np.array(vocab.tokens, dtype=object)[normal]  # (N,) str
    if not pieces.size:
        return []
    lengths = np.fromiter(map(len, pieces), np.int64, count=pieces.size)
    target, cut, left, right = _find_splits(pieces, lengths)
    order = np.lexsort((-cut, _priority(vocab, normal)[target]))
    return list(zip(pieces[left[order]].tolist(), pieces[right[order]].tolist(), strict=True))


def _priority(vocab: Vocabulary, normal: np.ndarray) -> np.ndarray:
    """Rank of each normal piece: 0 merges first."""
    scores = vocab.scores[normal] if vocab.scores is not None else np.zeros(len(normal))
    order = np.lexsort((normal, -scores))
    rank = np.empty(len(normal), np.int64)
    rank[order] = np.arange(len(normal))
    return rank


def _find_splits(pieces: np.ndarray, lengths: np.ndarray) -> Splits:
    short = np.flatnonzero(lengths <= _MAX_HASHED_LEN)
    found = _hashed_splits(pieces[short], lengths[short])
    if found is None:  # two pieces share a hash: never seen, but stay exact
        return _plain_splits(pieces, np.arange(pieces.size))
    target, cut, left, right = found
    parts = [(short[target], cut, short[left], short[right])]
    long = np.flatnonzero(lengths > _MAX_HASHED_LEN)
    if long.size:
        parts.append(_plain_splits(pieces, long))
    return _concat(parts)


def _plain_splits(pieces: np.ndarray, targets: np.ndarray) -> Splits:
    index = {piece: i for i, piece in enumerate(pieces.tolist())}
    rows = []
    for target in targets.tolist():
        piece = pieces[target]
        for cut in range(1, len(piece)):
            left, right = index.get(piece[:cut]), index.get(piece[cut:])
            if left is not None and right is not None:
                rows.append((target, cut, left, right))
    table = np.array(rows, np.int64).reshape(-1, 4)
    return table[:, 0], table[:, 1], table[:, 2], table[:, 3]


def _hashed_splits(pieces: np.ndarray, lengths: np.ndarray) -> Splits | None:
    """Vectorised search: polynomial hashes of every prefix and suffix, checked char by char."""
    if not pieces.size:
        return _no_splits()
    by_length = np.argsort(lengths, kind="stable")
    lengths = lengths[by_length]
    width = int(lengths[-1])
    chars = pieces[by_length].astype(f"<U{width}").view(np.uint32)
    cols = chars.reshape(-1, width).T.astype(np.uint64)  # (W, N), zero-padded
    prefix = np.zeros((width + 1, pieces.size), np.uint64)  # (W+1, N): hash of piece[:pos]
    for pos in range(width):
        prefix[pos + 1] = prefix[pos] * _HASH_BASE + cols[pos]
    powers = np.ones(width + 1, np.uint64)
    powers[1:] = np.cumprod(np.full(width, _HASH_BASE, np.uint64))  # wraps mod 2**64, as wanted
    # Pieces of length n are the block [bounds[n], bounds[n + 1]).
    bounds = np.searchsorted(lengths, np.arange(width + 2)).tolist()
    tables = [_HashTable(prefix[n, bounds[n] : bounds[n + 1]], bounds[n]) for n in range(width + 1)]
    if not all(table.is_exact for table in tables):
        return None
    found = []
    for n in range(2, width + 1):
        block = slice(bounds[n], bounds[n + 1])
        for cut in range(1, n):
            left = tables[cut].find(prefix[cut, block])
            rows = np.flatnonzero(left >= 0) + bounds[n]
            right = tables[n - cut].find(prefix[n, rows] - prefix[cut, rows] * powers[n - cut])
            keep = right >= 0
            left, right, rows = left[left >= 0][keep], right[keep], rows[keep]
            same = (cols[:cut, rows] == cols[:cut, left]).all(axis=0)
            same &= (cols[cut:n, rows] == cols[: n - cut, right]).all(axis=0)
            found.append((rows[same], np.full(int(same.sum()), cut), left[same], right[same]))
    targets, cuts, lefts, rights = _concat(found)
    return by_length[targets], cuts, by_length[lefts], by_length[rights]


class _HashTable:
    """The hashes of one block of pieces, bucketed for vectorised lookups."""

    def __init__(self, hashes: np.ndarray, offset: int) -> None:
        bits = max(1, (2 * hashes.size).bit_length())  # at least two buckets per piece
        self._shift = np.uint64(64 - bits)
        buckets = self._bucket(hashes)
        order = np.argsort(buckets, kind="stable")
        self._hashes = hashes[order]
        self._ids = order + offset
        self._starts = np.zeros((1 << bits) + 1, np.int64)
        np.cumsum(np.bincount(buckets, minlength=1 << bits), out=self._starts[1:])
        self.is_exact = np.unique(hashes).size == hashes.size

    def _bucket(self, hashes: np.ndarray) -> np.ndarray:
        mixed = (hashes ^ (hashes >> np.uint64(29))) * _MIX  # spread short pieces' small hashes
        return (mixed >> self._shift).astype(np.intp)

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """Index of the piece with each hash, or -1."""
        found = np.full(hashes.size, -1, np.int64)
        bucket = self._bucket(hashes)
        start, end = self._starts[bucket], self._starts[bucket + 1]
        live = np.flatnonzero(start < end)
        step = 0
        while live.size:
            at = start[live] + step
            hit = self._hashes[at] == hashes[live]
            found[live[hit]] = self._ids[at[hit]]
            live = live[~hit & (at + 1 < end[live])]
            step += 1
        return found


def _no_splits() -> Splits:
    empty = np.zeros(0, np.int64)
    return empty, empty, empty, empty


def _concat(parts: list[Splits]) -> Splits:
    if not parts:
        return _no_splits()
    target, cut, left, right = (np.concatenate(column) for column in zip(*parts, strict=True))
    return target, cut, left, right
