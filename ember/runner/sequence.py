"""One request inside the runner: what it asks (Request), what it streams back (Piece, Done),
and its state while it runs (Sequence): inputs still to evaluate, sampler, stops, counts."""

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from ember.errors import EmberError
from ember.options import Options
from ember.runner.draft import Drafter
from ember.runner.inputcache import Slot, without_cut
from ember.runner.stop import StopMatcher
from ember.sample.grammar import Grammar
from ember.sample.sampler import Sampler
from ember.tokenizer import Tokenizer, Vocabulary

# done_reason values, as the runner reports them (Ollama's DoneReason 0, 1, 2)
STOP, LENGTH, CLOSED = "stop", "length", "closed"
# Ollama ends an answer whose token text, trimmed, came this many times in a row after its
# first (a model stuck on one token: whitespace in JSON, say), where it would run to num_predict
MAX_TOKEN_REPEATS = 30

log = logging.getLogger("ember.runner")


class InputTooLongError(EmberError):
    """A prompt longer than the context, with truncation turned off (HTTP 400)."""


@dataclass(frozen=True)
class Request:
    """A completion (or embedding) as the runner receives it: the prompt already tokenized."""

    inputs: list[int]
    options: Options = field(default_factory=Options)
    grammar: Grammar | None = None
    shift: bool = True  # when the context fills: shift it (True) or end with "length"
    truncate: bool = True  # a prompt longer than num_ctx: truncate it (True) or refuse it
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), OpenAI's logit_bias
    embedding: bool = False  # pooled hidden states instead of a generation
    # an embedding truncated to fit: the request's own num_ctx where it is below the engine's
    # (the scheduler loads at least 4 tokens; Ollama's embed handler cuts to what was asked)
    cut_to: int = 0
    # input index -> how many following inputs must share its batch (multimodal groups)
    same_batch: dict[int, int] = field(default_factory=dict)
    # input index -> the encoder data (an image's embeddings) that input carries into the model
    multimodal: dict[int, object] = field(default_factory=dict)
    # input index where an image's span begins -> the image's hash (prefix matching)
    image_hashes: dict[int, int] = field(default_factory=dict)
    # each input's token type (BERT's segment of a text pair), or () for all type 0
    token_types: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Piece:
    """Text that is final (no stop string can still claim it), with its tokens' logprobs."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Done:
    """The last event of a sequence; durations in nanoseconds, as Ollama reports them."""

    done_reason: str
    prompt_eval_count: int  # prompt tokens evaluated: a reused prefix is not counted
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
    embedding: list[float] | None = None
    error: str | None = None
    prompt_count: int = 0  # the whole prompt (after truncation), cached prefix included
    score: float | None = None  # a ranker's relevance score (an embedding request on a Ranker)
    prompt_cached_count: int = 0  # prompt tokens found in the cache (not evaluated again)
    # speculative decoding: drafted tokens, and those the target agreed with (None: no drafting)
    draft_proposed: int | None = None
    draft_accepted: int | None = None
    stop_sequence: str = ""  # the stop string that ended the sequence, if one did


Event = Piece | Done


def truncate(inputs: list[int], num_ctx: int, num_keep: int, same_batch: dict[int, int]) -> int:
    """How many inputs after num_keep to drop so the prompt fits num_ctx (0 if it fits); the
    cut moves forward past any same_batch group it would split."""
    if len(inputs) <= num_ctx:
        return 0
    discard = len(inputs) - num_ctx
    end = num_keep + discard
    for start, n in same_batch.items():
        if start < end <= start + n:
            end = start + n + 1
    if end >= len(inputs):
        raise InputTooLongError("the prompt is too long to keep anything after truncation")
    return end - num_keep


def cut_embedding(inputs: list[int], num_ctx: int, vocab: Vocabulary) -> None:
    """Cut an embedding's inputs to num_ctx keeping the start of its text and the tokens the
    vocabulary puts around it (BERT's [CLS] and [SEP]; the end token that last-token pooling
    reads), as Ollama's text cut to fit and encoded again."""
    opening = int(vocab.add_bos and vocab.bos_id is not None and inputs[0] == vocab.bos_id)
    closing = int(vocab.add_eos and vocab.eos_id is not None and inputs[-1] == vocab.eos_id)
    if num_ctx <= opening + closing:  # Ollama's words
        raise InputTooLongError("input after truncation exceeds maximum context length")
    del inputs[num_ctx - closing : len(inputs) - closing]


def keep_whole_groups(num_keep: int, same_batch: dict[int, int], num_ctx: int) -> int:
    """num_keep moved off the inside of a same_batch group (an image's span): to its end, so
    the image is kept whole, unless that leaves nothing to discard; then to its start."""
    for start, n in same_batch.items():
        if start < num_keep <= start + n:
            return start + n + 1 if start + n + 1 < num_ctx else start
    return num_keep


class Sequence:
    """A request's state inside the runner loop. Consumers read `events`; `cancel()` is safe
    from any thread and takes effect within one step."""

    slot: Slot  # set by the runner when the sequence gets one
    groups: list[int]  # same_batch group size of each pending input (0: none)
    carried: list[object | None]  # the multimodal data of each pending input (None: none)

    def __init__(self, request: Request, tokenizer: Tokenizer, num_ctx: int) -> None:
        opts, inputs = request.options, list(request.inputs)
        if not inputs:
            raise EmberError("the prompt is empty")
        if request.token_types and (
            len(request.token_types) != len(inputs) or not request.embedding
        ):  # an embedding's inputs are only ever cut at the end, their types with them
            raise EmberError("token types go with an embedding request, one per input")
        # its images' embeddings are kept only in self.multimodal, which a context shift edits
        self.request = replace(request, multimodal={})
        same_batch, multimodal = dict(request.same_batch), dict(request.multimodal)
        num_keep = min(len(inputs) if opts.num_keep < 0 else opts.num_keep, num_ctx - 1)
        self.num_keep = keep_whole_groups(num_keep, same_batch, num_ctx)
        image_hashes = dict(request.image_hashes)
        fits = min(num_ctx, request.cut_to or num_ctx)
        if len(inputs) > fits and request.embedding and request.truncate:
            cut_embedding(inputs, fits, tokenizer.vocabulary)
        if len(inputs) > num_ctx:
            if not request.truncate:
                raise InputTooLongError(
                    # Ollama's words first: its clients and tests match them
                    f"the input length exceeds the context length ({len(inputs)} tokens, "
                    f"{num_ctx} allowed)"
                )
            cut = truncate(inputs, num_ctx, self.num_keep, same_batch)
            log.warning(  # as Ollama's runner: the answer will not see all of the prompt
                "truncating input prompt limit=%d prompt=%d keep=%d new=%d",
                num_ctx, len(inputs), self.num_keep, len(inputs) - cut,
            )
            del inputs[self.num_keep : self.num_keep + cut]
            same_batch = without_cut(same_batch, self.num_keep, cut)
            multimodal = without_cut(multimodal, self.num_keep, cut)
            image_hashes = without_cut(image_hashes, self.num_keep, cut)
        self.prompt = inputs
        self.token_types = request.token_types[: len(inputs)]  # cut as an embedding's inputs
        # keyed by position in the sequence (in its slot's cache), kept so by `shifted`
        self.same_batch = same_batch
        self.multimodal = multimodal
        self.image_hashes = image_hashes
        self.pending: list[int] = []  # inputs not yet in the cache; set when a slot is taken
        self.groups = []
        self.carried = []
        self.num_ctx = num_ctx
        # as Ollama, num_predict 0 or less sets no limit of its own (its runner limits only a
        # positive one): then, as for one past it, the cap of 10 × num_ctx
        limit = 10 * num_ctx
        self.num_predict = opts.num_predict if 0 < opts.num_predict <= limit else limit
        self.embedding = request.embedding
        self.sampler = Sampler(replace(opts.sampling(), logit_bias=request.logit_bias))
        self.sampler.accept_all(inputs)  # the prompt counts for the repeat penalties
        self.grammar = request.grammar
        self.stops = StopMatcher(opts.stop)
        self.decoder = tokenizer.stream_decoder()
        self.generated: list[int] = []
        self.ended_on_eos = False  # an end token was sampled: it counts in eval_count
        self.last_text, self.text_repeats = "", 0  # the last token's trimmed text, its run
        self.held_logprobs: list[TokenLogprob] = []  # of tokens whose text is held back
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.cancelled = False
        self.on_event: Callable[[], None] | None = None
        self.started = time.perf_counter_ns()
        self.first_token = 0  # when prompt processing ended
        self.pooled: torch.Tensor | None = None  # sum of hidden states (embedding requests)
        self.num_past = 0  # prompt tokens found in the cache
        self.position_shifts: list[tuple[int, int]] = []  # set by the engine (positions.py)
        self.drafter: Drafter | None = None  # who drafts its tokens (set by the engine)
        self.draft_limit = 0  # tokens drafted per step, at most
        self.draft_proposed = 0
        self.draft_accepted = 0

    def queue(self, inputs: list[int], first: int) -> None:
        """Puts inputs (at positions first on) before those pending, each with its same_batch
        group and the image data it carries."""
        positions = range(first, first + len(inputs))
        self.pending[:0] = inputs
        self.groups[:0] = [self.same_batch.get(i, 0) for i in positions]
        self.carried[:0] = [self.multimodal.get(i) for i in positions]

    def shifted(self, dropped: int, again: list[int]) -> None:
        """After a context shift dropped `dropped` inputs after num_keep: the images in the cut
        are forgotten (their embeddings with them), the later ones move down; `again`, the kept
        inputs of a shift not done in place, are evaluated once more, images with embeddings."""
        cut = (self.num_keep, dropped)
        self.same_batch = without_cut(self.same_batch, *cut)
        self.multimodal = without_cut(self.multimodal, *cut)
        self.image_hashes = without_cut(self.image_hashes, *cut)
        self.queue(again, 0)

    def cancel(self) -> None:
        self.cancelled = True

    def repeats_too_often(self, text: str) -> bool:
        """Whether a token of this text, trimmed, makes a run of the same more than
        MAX_TOKEN_REPEATS long after its first (Ollama's count: from "", whitespace as one)."""
        text = text.strip()
        if text == self.last_text:
            self.text_repeats += 1
        else:
            self.last_text, self.text_repeats = text, 0
        return self.text_repeats > MAX_TOKEN_REPEATS

    def send(self, event: Event) -> None:
        self.events.put(event)
        if self.on_event is not None:
            try:
                self.on_event()
            except RuntimeError:  # the consumer's event loop is gone: nobody to wake
                self.on_event = None

    def done(
        self, reason: str, *, embedding: list[float] | None = None, score: float | None = None
    ) -> Done:
        end = time.perf_counter_ns()
        first = self.first_token or end
        event = Done(
            done_reason=reason,
            prompt_eval_count=len(self.prompt) - self.num_past,
            prompt_eval_duration=first - self.started,
            # every sampled token, the end token too, as Ollama's numPredicted
            eval_count=len(self.generated) + self.ended_on_eos,
            eval_duration=end - first,
            embedding=embedding,
            prompt_count=len(self.prompt),
            score=score,
            prompt_cached_count=self.num_past,
            draft_proposed=self.draft_proposed if self.drafter is not None else None,
            draft_accepted=self.draft_accepted if self.drafter is not None else None,
            stop_sequence=self.stops.matched,
        )
        self.send(event)
        return event

    def fail(self, message: str) -> None:
        n = len(self.prompt)
        self.send(Done("error", 0, 0, len(self.generated), 0, error=message, prompt_count=n))
