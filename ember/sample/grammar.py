"""Structured outputs: a grammar (JSON, a JSON schema, a regex or Lark) as a token mask per step.

Built on llguidance; this module neither samples nor runs the model (see `constrain` for the glue).
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import llguidance
import numpy as np

from ember.errors import EmberError
from ember.sample.schema_values import admits_a_value

if TYPE_CHECKING:  # torch loads where a mask is made: the server checks formats without it
    import torch

# Compact separators as json.dumps writes them, no free whitespace: models write this form
# naturally, and unbounded whitespace would let a model pad the output forever. Lenient: a
# keyword or format llguidance does not implement (uniqueItems, "format": "binary", which
# Pydantic writes for set and bytes fields) is not enforced rather than refused, as llama.cpp's
# converter, Ollama's, skips what it does not know; a schema that is wrong is still refused.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}

# Ollama's format "json" is any JSON object (its grammar's root is an object).
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


class GrammarError(EmberError, ValueError):
    """A format the grammar engine rejects, or a token the grammar does not allow."""


class TokenSource(Protocol):
    """What Grammar needs of a tokenizer (ember.tokenizer.Tokenizer has it)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_ids(self) -> frozenset[int]: ...
    @property
    def bos_id(self) -> int | None: ...
    def token_bytes(self, id: int) -> bytes: ...
    def is_special(self, id: int) -> bool: ...
    def encode(self, text: str, *, add_special: bool = True) -> list[int]: ...


class _Wrapper:
    """The duck-typed tokenizer llguidance.TokenizerWrapper reads (fields and __call__)."""

    def __init__(self, tokenizer: TokenSource) -> None:
        ids = range(tokenizer.vocab_size)
        self.eos_token_id = min(tokenizer.eos_ids)
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in ids]
        # special (control) tokens are never matched by text, so never allowed inside JSON
        self.special_token_ids = [i for i in ids if tokenizer.is_special(i)]
        self._encode = tokenizer.encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._encode(text, add_special=False)


_cache: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def ll_tokenizer(tokenizer: TokenSource) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of `tokenizer`, built once per tokenizer object (~0.2 s for 49k)."""
    with _cache_lock:
        cached = _cache.get(tokenizer)
        if cached is None:
            if not tokenizer.eos_ids:
                raise GrammarError("structured outputs need a tokenizer with an EOS token")
            cached = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapper(tokenizer)))
            _cache[tokenizer] = cached
        return cached


def grammar_text(fmt: str | dict[str, Any]) -> str:
    """The llguidance grammar of a format.

    fmt is "json" (any JSON object, as Ollama), a JSON schema (a dict), {"regex": "<pattern>"}
    or {"lark": "<grammar>"} (a dict with exactly that one key; Python API only).
    """
    if fmt == "json" or fmt == {}:  # {}: as llama.cpp's converter (Ollama's), an object
        fmt = ANY_JSON_OBJECT
    if isinstance(fmt, str):
        raise GrammarError(f'format must be "json" or a JSON schema object, not {fmt!r}')
    if not isinstance(fmt, dict):
        raise GrammarError(f"format must be a string or a dict, not {type(fmt).__name__}")
    for key, compile_ in (("regex", llguidance.LLMatcher.grammar_from_regex),
                          ("lark", llguidance.LLMatcher.grammar_from_lark)):  # fmt: skip
        if key in fmt:  # no JSON Schema keyword: never read as a schema
            if len(fmt) != 1 or not isinstance(fmt[key], str):
                raise GrammarError(f'a {key} format is {{"{key}": "<text>"}} and nothing else')
            return compile_(fmt[key])
    if not admits_a_value(fmt):
        raise GrammarError(
            "invalid JSON schema: no JSON value satisfies it (a part it requires is false, or "
            "would have to contain itself through a $ref)"
        )
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(closed_objects(fmt)),
            defaults=JSON_OPTIONS,  # type: ignore[arg-type]
        )
    except (TypeError, ValueError) as err:
        raise GrammarError(f"invalid JSON schema: {err}") from err


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "contains")


def closed_objects(schema: Any, *, close: bool = True) -> Any:
    """A copy of a JSON schema where every object with `properties` and no
    `additionalProperties` gets `"additionalProperties": false`.

    Ollama turns a schema into a grammar with llama.cpp's converter, which treats such an
    object as closed; llguidance follows JSON Schema and leaves it open, so a model could add
    keys Pydantic's `model_json_schema()` (which omits the key) never declared. `true` or a
    schema in `additionalProperties` still allows extra keys. The members of `allOf` stay
    open: closing each would forbid the keys the others declare.
    """
    if isinstance(schema, list):
        return [closed_objects(s, close=close) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if close and isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(s) for name, s in out[key].items()}
    for key in (*_SCHEMA_LISTS, *_SCHEMA_VALUES):
        if key in out:
            out[key] = closed_objects(out[key])
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(s, close=False) for s in out["allOf"]]
    return out


class Grammar:
    """The tokens a format allows next, advanced one sampled token at a time.

    Overlapping the mask with the forward pass: llguidance releases the GIL while it computes,
    so a caller can run `future = pool.submit(grammar.mask)` on a thread right after
    `accept(token)`, run the model's forward pass, then apply `future.result()` to its logits.
    Each mask() returns a new tensor. The unpacking uses numpy, not torch: a side thread
    that starts torch's parallel work would slow the model's own thread (backend/threads.py).
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, eos_ids: frozenset[int]
    ) -> None:
        self._matcher = matcher
        # llguidance knows one end token (the lowest id); every other one the model may end
        # with (<|im_end|> beside <|endoftext|>, <end_of_turn> beside <eos>) is allowed with it,
        # as llama.cpp's grammar takes every EOG token (Ollama passes its whole EOS set)
        self.vocab_size, self.eos_id, self.end_ids = vocab_size, min(eos_ids), eos_ids
        self._other_ends = np.array(sorted(i for i in eos_ids if i != self.eos_id), np.int64)
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # packed mask

    @classmethod
    def from_format(cls, fmt: str | dict[str, Any], tokenizer: TokenSource) -> Grammar:
        """A grammar for fmt (see grammar_text); raises GrammarError when it is rejected."""
        ll = ll_tokenizer(tokenizer)
        text = grammar_text(fmt)
        matcher = llguidance.LLMatcher(ll, text, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid format {_short(fmt)}: {matcher.get_error()}")
        return cls(matcher, tokenizer.vocab_size, tokenizer.eos_ids)

    def mask(self) -> torch.Tensor:
        """(vocab_size,) bool: the tokens allowed next; EOS once the output is complete."""
        bits = self._bits
        self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        # little-endian int32 words: byte k of the buffer holds tokens 8k..8k+7, lowest bit first
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little", count=self.vocab_size)
        if allowed[self.eos_id]:
            allowed[self._other_ends] = 1
        import torch

        return torch.from_numpy(allowed.view(np.bool_))

    def accept(self, token: int) -> None:
        """Advances past token; raises GrammarError (and stays broken) when it is not allowed."""
        if not self._matcher.consume_token(token):
            # llguidance's first line says why; the rest dumps its parser state and grammar
            reason = self._matcher.get_error().strip().splitlines()[0][:300]
            raise GrammarError(f"token {token} is not allowed here: {reason}")

    def is_done(self) -> bool:
        """Whether the output is complete and only EOS may follow."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def is_accepting(self) -> bool:
        """Whether the output so far is complete (more tokens may still be allowed)."""
        return self._matcher.is_accepting()


def constrain(logits: torch.Tensor, grammar: Grammar) -> torch.Tensor:
    """logits (V,) with every token the grammar does not allow next set to -inf (a new tensor).

    A model whose logits are wider than the tokenizer's vocabulary (padding rows) gets those
    extra tokens disallowed as well.
    """
    import torch

    allowed = grammar.mask()
    out = torch.full_like(logits, float("-inf"))
    n = min(logits.shape[-1], allowed.numel())
    keep = allowed[:n].to(logits.device)
    out[..., :n] = torch.where(keep, logits[..., :n], out[..., :n])
    return out


def _short(fmt: object) -> str:
    text = json.dumps(fmt) if isinstance(fmt, dict) else repr(fmt)
    return text if len(text) <= 80 else text[:77] + "..."
