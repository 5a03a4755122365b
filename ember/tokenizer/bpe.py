"""Byte-level BPE (`tokenizer.ggml.model = gpt2`) as a HF `tokenizers` object.

A regex split chosen by `tokenizer.ggml.pre`, the GPT-2 byte alphabet, then the file's merges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

from ember.tokenizer.vocab import TokenType, Vocabulary, VocabularyError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """How text is cut into words before the merges run."""

    regex: str | None  # None: GPT-2's own regex (the ByteLevel pre-tokenizer's)
    first: tuple[str, ...] = ()  # regexes that split the text before `regex` does, in order
    split_digits: bool = False  # every digit alone first, as llama.cpp does for starcoder/smollm
    ignore_merges: bool = False  # a word that is itself a token stays whole (llama3)


# The regexes are the ones transformers' GGUF loader and llama.cpp use for these names.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek V3's three splits, one after another (its tokenizer.json's Sequence; llama.cpp's and
# Ollama's deepseek-v3): runs of up to three digits, runs of CJK ideographs and kana, the rest
_DEEPSEEK3 = (
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek LLM's and DeepSeek Coder's splits (V2 files' `deepseek-llm`), one after another, as
# llama.cpp's llama-vocab.cpp writes them
_DEEPSEEK_LLM = (
    '[\r\n]',
    '\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+',
    '\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+',
    '\\s+$',
    '[一-龥ࠀ-一가-\ud7ff]+',
    '\\p{N}+',
)
_DEEPSEEK_CODER = (
    '[\r\n]',
    '\\s?\\p{L}+',
    '\\s?\\p{P}+',
    '[一-龥ࠀ-一가-\ud7ff]+',
    '\\p{N}',
)

_GPT2_SPLIT = PreTokenizer(None)
_DIGITS_THEN_GPT2 = PreTokenizer(None, split_digits=True)
_LLAMA3_SPLIT = PreTokenizer(_LLAMA3, ignore_merges=True)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **dict.fromkeys(("default", "gpt2", "gpt-2", "phi-2", "olmo", "roberta-bpe"), _GPT2_SPLIT),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        _DIGITS_THEN_GPT2,
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe", "glm4"), PreTokenizer(_LLAMA3)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "kormo"), PreTokenizer(_QWEN2)),
    "qwen35": PreTokenizer(_QWEN35),
    "laguna": PreTokenizer(_QWEN2, first=(r"(?:\r?\n)+(?!\r?\n)",)),  # Ollama's: newline runs first
    "tekken": PreTokenizer(_TEKKEN),
    "deepseek-v3": PreTokenizer(_DEEPSEEK3, first=(r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+")),
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM[-1], first=_DEEPSEEK_LLM[:-1]),
    "deepseek-coder": PreTokenizer(_DEEPSEEK_CODER[-1], first=_DEEPSEEK_CODER[:-1]),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2", "kanana2"), PreTokenizer(_GPT4O)),
}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character that spells it in the vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shift)
            shift += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}


# str.translate table from alphabet characters back to latin-1 code points (= the bytes).
_UNSPELL = {ord(char): byte for byte, char in byte_alphabet().items()}


def pre_tokenizer_for(name: str) -> PreTokenizer:
    """The split for `tokenizer.ggml.pre`; an unknown name falls back to GPT-2's, with a warning."""
    found = PRE_TOKENIZERS.get(name)
    if found is None:
        log.warning("unknown pre-tokenizer %r: using the GPT-2 split; ids may differ", name)
        return _GPT2_SPLIT
    return found


def build_bpe(vocab: Vocabulary) -> Tokenizer:
    """A HF tokenizer that encodes text without BOS/EOS; specials are added tokens."""
    split = pre_tokenizer_for(vocab.pre)
    ids = dict(zip(reversed(vocab.tokens), range(vocab.size - 1, -1, -1), strict=True))
    try:
        model = models.BPE(
            vocab=ids, merges=_merge_pairs(vocab.merges), ignore_merges=split.ignore_merges
        )
    except Exception as err:  # tokenizers raises plain Exceptions for bad merges
        raise VocabularyError(f"the BPE merges do not fit the vocabulary: {err}") from err
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = _pre_tokenizer(split)
    tokenizer.add_special_tokens(special_tokens(vocab))
    return tokenizer


def special_tokens(vocab: Vocabulary) -> list[AddedToken]:
    """Control and user-defined tokens, matched whole in the raw text (longest first)."""
    texts = (vocab.tokens[i] for i in vocab.special_ids().tolist())
    return [AddedToken(text, normalized=False, special=True) for text in texts if text]


def token_bytes(token: str, token_type: int) -> bytes:
    """The bytes a byte-level token stands for; specials are stored as their raw text."""
    if token_type in (TokenType.CONTROL, TokenType.USER_DEFINED):
        return token.encode()
    unspelled = token.translate(_UNSPELL)
    try:
        return unspelled.encode("latin-1")
    except UnicodeEncodeError:  # a character outside the alphabet stands for itself
        return b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode() for c in unspelled)


def _merge_pairs(merges: tuple[str, ...]) -> list[tuple[str, str]]:
    try:
        return [(left, right) for left, right in (merge.split(" ") for merge in merges)]
    except ValueError as err:
        raise VocabularyError("a merge is not of the form 'left right'") from err


def _pre_tokenizer(split: PreTokenizer) -> pre_tokenizers.PreTokenizer:
    if split.regex is not None:
        steps: list[pre_tokenizers.PreTokenizer] = [
            pre_tokenizers.Split(Regex(regex), behavior="isolated")
            for regex in (*split.first, split.regex)
        ]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    else:
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if split.split_digits:
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    return pre_tokenizers.Sequence(steps)
