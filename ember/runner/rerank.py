"""A reranker's inputs: a query and one document as the token pair a cross-encoder reads
(BERT's `[CLS] query [SEP] document [SEP]`, token types 0 for the query's part, 1 after)."""

from ember.runner.sequence import Request
from ember.tokenizer import Tokenizer


def pair_request(tokenizer: Tokenizer, query: str, document: str, *, truncate: bool) -> Request:
    """The embedding request whose pooled score ranks document against query."""
    first = tokenizer.encode(query)  # [CLS] query [SEP]
    second = tokenizer.encode(document, add_special=False)
    vocab = tokenizer.vocabulary
    if vocab.add_eos and vocab.eos_id is not None:
        second.append(vocab.eos_id)  # the closing [SEP]
    types = (0,) * len(first) + (1,) * len(second)
    return Request(first + second, embedding=True, truncate=truncate, token_types=types)
