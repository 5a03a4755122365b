"""BERT's WordPiece tokenizer from a GGUF vocabulary in llama.cpp's "phantom space" spelling
(`▁word` starts a word, a continuation has no `##`): HF `tokenizers`' own BertNormalizer (clean
text, CJK characters split, lowercase, accents stripped), BertPreTokenizer and WordPiece."""

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from ember.tokenizer.bpe import special_tokens
from ember.tokenizer.vocab import TokenType, Vocabulary, VocabularyError

SPACE = "\u2581"
MAX_WORD_CHARS = 100  # longer words are one [UNK], as BERT's tokenizer


def wordpiece_token(token: str, token_type: int) -> str:
    """The vocabulary entry as WordPiece spells it: `▁word` -> `word`, `piece` -> `##piece`."""
    if token_type != TokenType.NORMAL or (token.startswith("[") and token.endswith("]")):
        return token
    if token.startswith(SPACE):
        return token[1:]
    return "##" + token


def build_wordpiece(vocab: Vocabulary) -> Tokenizer:
    """A HF tokenizer that encodes text without [CLS]/[SEP]; specials are added tokens."""
    if vocab.unknown_id is None:
        raise VocabularyError("a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id")
    ids: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.types.tolist(), strict=True)):
        ids.setdefault(wordpiece_token(token, kind), i)
    model = models.WordPiece(
        vocab=ids,
        unk_token=vocab.tokens[vocab.unknown_id],
        max_input_chars_per_word=MAX_WORD_CHARS,
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(special_tokens(vocab))
    return tokenizer


def token_bytes(token: str, token_type: int) -> bytes:
    """The text a token stands for: a word start reads with its space, specials as written."""
    if token_type == TokenType.NORMAL and token.startswith(SPACE):
        return b" " + token[1:].encode()
    return token.encode()
