"""A reranker's inputs: a query and one document as the token pair a cross-encoder reads
(BERT's `[CLS] query [SEP] document [SEP]`, token types 0 for the query's part, 1 after), or as
the one prompt a causal reranker reads (Qwen3-Reranker's template)."""

from ember.model import Model, PromptRanker
from ember.runner.sequence import Request
from ember.tokenizer import Tokenizer


def rerank_request(
    model: Model,
    tokenizer: Tokenizer,
    query: str,
    document: str,
    *,
    num_ctx: int,
    truncate: bool,
) -> Request:
    """The embedding request whose pooled score ranks document against query; a prompt too
    long for num_ctx loses its end (a pair: its document's end, see pair_request)."""
    if isinstance(model, PromptRanker):
        ids = tokenizer.encode(model.rerank_prompt(query, document))
        return Request(ids, embedding=True, truncate=truncate)
    return pair_request(tokenizer, query, document, num_ctx=num_ctx, truncate=truncate)


def pair_request(
    tokenizer: Tokenizer, query: str, document: str, *, num_ctx: int, truncate: bool
) -> Request:
    """The embedding request whose pooled score ranks document against query. A pair longer
    than num_ctx loses the end of its document, its closing [SEP] kept (HF's "only_second"
    truncation); without `truncate` it is refused when submitted."""
    first = tokenizer.encode(query)  # [CLS] query [SEP]
    second = tokenizer.encode(document, add_special=False)
    vocab = tokenizer.vocabulary
    closing = [vocab.eos_id] if vocab.add_eos and vocab.eos_id is not None else []
    if truncate and len(first) + len(second) + len(closing) > num_ctx:
        second = second[: max(num_ctx - len(first) - len(closing), 0)]
    second += closing
    types = (0,) * len(first) + (1,) * len(second)
    return Request(first + second, embedding=True, truncate=truncate, token_types=types)
