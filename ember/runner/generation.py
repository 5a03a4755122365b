"""One sequence's generation over a model and its cache: prefill in num_batch chunks, sample,
stream text pieces, stop on end tokens, stop strings or num_predict, shift the context when full.

This single-sequence loop is what ember.LLM runs until the multi-sequence runner takes over.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ember.batch import Batch
from ember.kvcache import Cache
from ember.model import Model, forward
from ember.options import Options
from ember.runner.stop import StopMatcher
from ember.sample import Sampler
from ember.sample.grammar import Grammar, constrain
from ember.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A finished generation; durations in nanoseconds, as Ollama reports them."""

    text: str
    tokens: list[int]
    done_reason: str  # "stop" (end token or stop string) or "length" (num_predict reached)
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
    total_duration: int


class Session:
    """A model with its one-sequence cache, reusing the common prefix of consecutive prompts."""

    def __init__(self, model: Model, tokenizer: Tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.cache: Cache = model.make_cache()
        self.size = (0, 0)  # (num_ctx, num_batch) the cache is sized for
        self.cached: list[int] = []  # tokens whose keys and values the cache holds, in order

    def fit(self, opts: Options) -> int:
        num_ctx = min(opts.num_ctx, self.model.context_length)
        size = (num_ctx, min(opts.num_batch, num_ctx))
        if size != self.size:
            self.cache.init(max_sequences=1, capacity=num_ctx, max_batch=size[1])
            self.size, self.cached = size, []
        return num_ctx

    def reuse_prefix(self, ids: list[int]) -> int:
        """Keeps the cached tokens shared with ids (at least one token is evaluated again)."""
        n = 0
        limit = min(len(self.cached), len(ids) - 1)
        while n < limit and self.cached[n] == ids[n]:
            n += 1
        if not self.cache.can_resume(0, n):
            n = 0
        self.cache.remove(0, n, None)
        del self.cached[n:]
        return n

    def step(self, ids: list[int], num_batch: int) -> torch.Tensor:
        """Runs ids after the cached tokens, in chunks; logits (V,) of the last one."""
        logits = torch.empty(0)
        for start in range(0, len(ids), num_batch):
            chunk = ids[start : start + num_batch]
            logits = forward(self.model, self.cache, Batch.single(chunk, len(self.cached)))[0]
            self.cached.extend(chunk)
        return logits

    def shift(self, num_keep: int, num_ctx: int) -> None:
        """Drops half of what follows the first num_keep tokens, as Ollama's context shift."""
        discard = max((num_ctx - num_keep) // 2, 1)
        self.cache.remove(0, num_keep, num_keep + discard)
        del self.cached[num_keep : num_keep + discard]


def truncate(ids: list[int], num_ctx: int, num_keep: int) -> list[int]:
    """A prompt longer than num_ctx keeps its first num_keep tokens and its end."""
    if len(ids) <= num_ctx:
        return ids
    return ids[:num_keep] + ids[len(ids) - (num_ctx - num_keep) :]


class Generation:
    """Iterates text pieces; `result` is set once the iteration ends."""

    def __init__(
        self, session: Session, ids: list[int], opts: Options, grammar: Grammar | None = None
    ) -> None:
        """grammar, when given, constrains every sampled token (structured outputs)."""
        self.session, self.ids, self.opts, self.grammar = session, ids, opts, grammar
        self.result: GenerateResult | None = None

    def __iter__(self) -> Iterator[str]:
        s, opts, tok = self.session, self.opts, self.session.tokenizer
        start = time.perf_counter_ns()
        num_ctx = s.fit(opts)
        num_keep = min(len(self.ids) if opts.num_keep < 0 else opts.num_keep, num_ctx - 1)
        ids = truncate(self.ids, num_ctx, num_keep)
        num_predict = opts.num_predict if 0 <= opts.num_predict <= 10 * num_ctx else 10 * num_ctx
        sampler, stops, decoder = (
            Sampler(opts.sampling()),
            StopMatcher(opts.stop),
            tok.stream_decoder(),
        )
        sampler.accept_all(ids)  # the prompt counts for the repeat penalties
        logits = s.step(ids[s.reuse_prefix(ids) :], s.size[1])
        prompt_done = time.perf_counter_ns()
        out: list[int] = []
        text: list[str] = []
        reason = "length"
        while len(out) < num_predict:
            if self.grammar is not None:
                logits = constrain(logits, self.grammar)
            token = sampler.sample(logits)
            if token in tok.eos_ids:
                reason = "stop"
                break
            out.append(token)
            sampler.accept(token)
            if self.grammar is not None:
                self.grammar.accept(token)
            piece = stops.push(decoder.push(token))
            if piece:
                text.append(piece)
                yield piece
            if stops.is_stopped:
                reason = "stop"
                break
            if len(s.cached) + 1 > num_ctx:
                s.shift(num_keep, num_ctx)
            logits = s.step([token], 1)
        tail = "" if stops.is_stopped else stops.push(decoder.flush()) + stops.flush()
        if tail:
            text.append(tail)
            yield tail
        end = time.perf_counter_ns()
        self.result = GenerateResult(
            text="".join(text),
            tokens=out,
            done_reason=reason,
            prompt_eval_count=len(ids),
            prompt_eval_duration=prompt_done - start,
            eval_count=len(out),
            eval_duration=end - prompt_done,
            total_duration=end - start,
        )
