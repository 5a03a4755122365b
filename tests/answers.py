"""The text a client gets for generated ids, to compare with a reference's ids."""

import codecs

from ember.tokenizer import Tokenizer


def streamed_text(tok: Tokenizer, ids: list[int]) -> str:
    """What the engine streams for generated ids: decode's text, but for a character cut short
    at the end, which the stream drops (StreamDecoder.flush, as Ollama's) and decode makes
    U+FFFD."""
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    utf8.decode(b"".join(tok.token_bytes(i) for i in ids))
    text = tok.decode(ids)
    return text.removesuffix("\ufffd") if utf8.getstate()[0] else text
