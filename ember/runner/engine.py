"""The run loop: one model serving many sequences over one shared KV cache.

Every step: next batch (scheduler.py: round-robin over the active sequences, at most num_batch
tokens) → forward (while a side thread computes the grammar masks) → sample → emit.
Speculative decoding: a sequence in its decode phase may add drafted tokens (draft.py) to its
last one; the batch asks for logits at each, and `_verify` keeps the drafted run as far as the
sampler agrees with it, so the tokens are those plain decoding gives.
Requests come in from any thread with `submit`; their events come out of `Sequence.events`.
"""

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ember import envconfig
from ember.backend import heap
from ember.batch import Batch
from ember.errors import EmberError
from ember.kvcache import KV_TYPES as KV_CACHE_TYPES
from ember.kvcache import CellCounter
from ember.model import Model
from ember.options import MAX_DRAFT
from ember.runner.draft import DraftModel, choose_drafter
from ember.runner.inputcache import InputCache
from ember.runner.memory import reserve
from ember.runner.pooling import Pooler
from ember.runner.positions import image_shifts
from ember.runner.scheduler import Part, Scheduler, make_batch
from ember.runner.sequence import CLOSED, LENGTH, STOP, Piece, Request, Sequence, TokenLogprob
from ember.sample.batched import sample_rows
from ember.sample.sampler import logprobs
from ember.tokenizer import Tokenizer

log = logging.getLogger(__name__)

KV_TYPES = KV_CACHE_TYPES  # f32, f16, bf16, q8_0, q4_0 (ember/kvcache/store.py)
DEFAULT_KV_TYPE = "f16"  # Ollama's default; attention still computes in float32


_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Stop every loop before the interpreter tears down: a loop or compute thread still inside
    # torch at exit can abort the process ("terminate called without an active exception").
    for engine in list(_live):
        engine.close()


class EngineClosedError(EmberError):
    """The engine was closed while a request waited or ran."""


@dataclass(frozen=True, slots=True)
class Usage:
    """How busy an engine is, for the runner's /health (read without the loop's lock: a
    snapshot that may be a step old)."""

    num_slots: int
    slots_busy: int
    kv_cells_used: int  # cells holding some sequence's keys
    kv_cells: int  # cells in the pool


class Engine:
    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        *,
        num_parallel: int = 1,
        num_ctx: int = 4096,
        num_batch: int = 512,
        kv_type: str = "",
        multiuser: bool = False,
        draft_model: Model | None = None,
    ) -> None:
        """draft_model: a small model with the same vocabulary (draft.check_vocabulary) that
        drafts for requests with draft_num_predict > 0 and no draft_ngram."""
        kv_type = kv_type or envconfig.kv_cache_type() or DEFAULT_KV_TYPE
        if kv_type not in KV_TYPES:
            raise EmberError(
                f"kv cache type {kv_type!r} is not supported (use {', '.join(KV_TYPES)})"
            )
        if num_parallel < 1 or num_ctx < 1 or num_batch < 1:
            raise EmberError("num_parallel, num_ctx and num_batch must be at least 1")
        self.model, self.tokenizer = model, tokenizer
        self.num_parallel = num_parallel
        self.num_ctx = min(num_ctx, model.context_length)  # per sequence
        self.num_batch = min(num_batch, self.num_ctx)
        self.kv_type = kv_type
        self._pooler = Pooler(model)
        self.cache = model.make_cache()
        self.inputs = InputCache(
            self.cache, num_ctx=self.num_ctx, num_slots=num_parallel, multiuser=multiuser
        )
        self.draft = (
            None
            if draft_model is None
            else DraftModel(
                draft_model, num_slots=num_parallel, num_ctx=self.num_ctx, num_batch=self.num_batch
            )
        )
        self.scheduler = Scheduler(
            self.inputs,
            num_ctx=self.num_ctx,
            num_batch=self.num_batch,
            vocab_size=tokenizer.vocab_size,
            finish=self._finish,
        )
        self.kv_bytes = 0
        self._cond = threading.Condition()
        self._waiting: deque[Sequence] = deque()  # guarded by _cond
        self._active: list[Sequence] = []  # the loop thread's own
        self._closed = False
        self._side = ThreadPoolExecutor(1, thread_name_prefix="ember-masks")
        # One thread does all of this engine's torch work, the reservation included (see
        # ember/backend/threads.py for why): __init__ waits for the reservation's outcome.
        self._reserved = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="ember-runner", daemon=True)
        self._thread.start()
        self._reserved.wait()
        if self._failure is not None:
            self._thread.join()
            self._side.shutdown()
            raise self._failure
        _live.add(self)

    # --- from any thread ---
    def submit(self, request: Request, *, on_event: Callable[[], None] | None = None) -> Sequence:
        """Queues a request; raises (e.g. InputTooLongError) before anything runs. on_event is
        called (on the loop thread) after each event is queued: to wake an async consumer."""
        seq = Sequence(request, self.tokenizer, self.num_ctx)
        seq.on_event = on_event
        seq.drafter, seq.draft_limit = choose_drafter(request, self.draft)
        with self._cond:
            if self._closed:
                raise EngineClosedError("the model is being unloaded")
            self._waiting.append(seq)
            self._cond.notify()
        return seq

    def busy(self) -> int:
        """How many sequences are waiting or running."""
        with self._cond:
            return len(self._waiting) + len(self._active)

    def usage(self) -> Usage:
        slots = self.inputs.slots
        if isinstance(self.cache, CellCounter):
            used, total = self.cache.cell_usage()
        else:  # a cache without a pool of cells: the tokens each slot holds
            used, total = sum(len(s.inputs) for s in slots), self.num_ctx * len(slots)
        return Usage(len(slots), sum(s.in_use for s in slots), used, total)

    def close(self) -> None:
        """Stops the loop; requests still waiting or running end with an error."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._side.shutdown()

    # --- the loop thread ---
    def _main(self) -> None:
        try:
            self.kv_bytes = reserve(
                self.model,
                self.cache,
                num_parallel=self.num_parallel,
                num_ctx=self.num_ctx,
                num_batch=self.num_batch,
                dtype=self.kv_type,
                num_outputs=self.num_parallel * (1 + MAX_DRAFT),  # a verify batch's logits
            )
            if self.draft is not None:
                self.kv_bytes += self.draft.reserve(self.kv_type)
            for slot in self.inputs.slots:
                slot.reserve_logits(self.model.vocab_size)
        except BaseException as err:
            self._failure = err
            return
        finally:
            self._reserved.set()
        self._run()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._active and not self._waiting:
                    self._cond.wait()
                if self._closed:
                    break
                cached = self._admit()
            for seq in cached:
                self._start_cached(seq)
            parts = self.scheduler.next_batch(self._active)
            if parts:
                try:
                    self._step(parts)
                except Exception as err:  # whatever a step raises ends its sequences, not
                    log.exception("a step failed")  # the loop: its callers would wait forever
                    for seq in {id(p.seq): p.seq for p in parts}.values():
                        if seq in self._active:
                            self._fail(seq, f"the step failed: {err}")
        with self._cond:  # busy() is 0 once closed: nothing waits on these any more
            ended = [*self._active, *self._waiting]
            self._active.clear()
            self._waiting.clear()
        for seq in ended:
            seq.fail("the model was unloaded")

    def _admit(self) -> list[Sequence]:
        """Gives waiting sequences free slots, first come first served (under _cond). Returns
        those whose whole prompt the cache holds with the logits after it (_start_cached)."""
        cached = []
        while self._waiting and self.inputs.has_free_slot():
            seq = self._waiting.popleft()
            if seq.cancelled:
                seq.done(CLOSED)
                continue
            seq.slot, num_past = self.inputs.load(
                seq.prompt, reuse=not seq.embedding, images=seq.image_hashes
            )
            seq.num_past = num_past
            seq.queue(seq.prompt[num_past:], num_past)
            if seq.embedding and not getattr(self.model, "is_causal", True):
                seq.groups[0] = len(seq.pending) - 1  # an encoder sees its whole input at once
            seq.position_shifts = image_shifts(self.model, seq.multimodal)
            self._active.append(seq)
            if not seq.pending:
                cached.append(seq)
        return cached

    def _start_cached(self, seq: Sequence) -> None:
        """Draws the first token of a sequence whose prompt is wholly cached from the logits its
        slot kept after that prompt: the draw an evaluation in the prompt's batch had, so the
        same seed repeats an answer (InputCache.load)."""
        assert seq.slot.logits is not None
        row = seq.slot.logits.clone()  # the kept logits stay as they are for the next request
        try:
            mask = [seq.grammar.mask() if seq.grammar is not None else None]
            token = sample_rows([seq.sampler], row[None], mask)[0]
            self._emit(seq, row, token)
        except Exception as err:  # as a failed step: the sequence ends, never the loop (its
            log.exception("sampling failed")  # thread gone, every later request would wait)
            if seq in self._active:
                self._fail(seq, f"sampling failed: {err}")

    def _step(self, parts: list[Part]) -> None:
        batch = make_batch(parts)
        # Beside the forward pass, on the side thread: the grammar masks of the rows about to
        # be sampled (llguidance releases the GIL). Every torch op stays on this thread: each
        # thread that calls into OpenMP gets its own spinning team, and two teams on two cores
        # slow each other down.
        constrained = [p for p in parts if p.output >= 0 and p.seq.grammar is not None]
        masking = self._side.submit(_masks, constrained) if constrained else None
        try:
            hidden = self._forward(batch)
            gen = [p for p in parts if p.output >= 0 and not p.seq.embedding]
            rows = [p.output + i for p in gen for i in range(1 + len(p.draft))]
            with torch.inference_mode():
                logits = self.model.logits(hidden[rows]) if gen else None
            masks = masking.result() if masking is not None else {}
        except Exception as err:  # a failed forward ends its sequences, never the loop
            log.exception("forward pass failed")
            for p in parts:
                self._fail(p.seq, f"the forward pass failed: {err}")
            return
        for p in parts:
            p.seq.slot.inputs.extend(p.seq.pending[: p.count])
            del p.seq.pending[: p.count], p.seq.groups[: p.count], p.seq.carried[: p.count]
        if logits is not None:  # one batched sampling step over every part's first row
            gen_masks = [masks.get(id(p)) for p in gen]
            firsts = [0]
            for p in gen[:-1]:
                firsts.append(firsts[-1] + 1 + len(p.draft))
            first_rows = logits if len(rows) == len(gen) else logits[firsts]
            tokens = sample_rows([p.seq.sampler for p in gen], first_rows, gen_masks)
            for first, p, token in zip(firsts, gen, tokens, strict=True):
                if not p.seq.generated:  # its prompt's end: kept for a request of the same
                    p.seq.slot.keep_logits(logits[first])
                if p.draft:
                    self._verify(p, logits[first : first + 1 + len(p.draft)], token)
                else:
                    self._emit(p.seq, logits[first], token)
        for p in parts:
            if p.seq.embedding:
                self._pool(p, hidden)

    def _forward(self, batch: Batch) -> torch.Tensor:
        self.cache.start_forward(batch)
        with torch.inference_mode():
            hidden = self.model.hidden(batch, self.cache)
        heap.give_back_freed(len(batch))  # before the head reads its weights: see heap.py
        return hidden

    def _emit(self, seq: Sequence, row: torch.Tensor, token: int) -> None:
        """Takes seq's sampled token (row: its raw logits) and streams what is final."""
        if not seq.first_token:
            seq.first_token = _now()
        if len(seq.generated) >= seq.num_predict:
            self._finish(seq, LENGTH)
            return
        if token in self.tokenizer.eos_ids:
            seq.ended_on_eos = True
            self._finish(seq, STOP)
            return
        seq.generated.append(token)
        piece = seq.decoder.push(token)
        if seq.repeats_too_often(piece):  # as Ollama: the repeat is not sent (nor its logprob)
            # a format's output cut before it is whole says so (Ollama's sends no done at all),
            # never a normal end of JSON that does not parse
            cut = seq.grammar is not None and not seq.grammar.is_accepting()
            self._finish(seq, LENGTH if cut else STOP)
            return
        seq.sampler.accept(token)
        if seq.grammar is not None:
            seq.grammar.accept(token)
        if seq.request.logprobs:
            seq.held_logprobs.append(self._logprob(row, token, seq.request.top_logprobs))
        text = seq.stops.push(piece)
        if text:
            seq.send(Piece(text, tuple(seq.held_logprobs)))
            seq.held_logprobs.clear()
        if seq.stops.is_stopped:
            self._finish(seq, STOP)
        elif len(seq.generated) >= seq.num_predict:
            self._finish(seq, LENGTH)
        else:
            seq.pending.append(token)
            seq.groups.append(0)
            seq.carried.append(None)

    def _verify(self, p: Part, rows: torch.Tensor, token: int) -> None:
        """Emits the tokens of a drafted run. rows (1 + len(draft), V): the logits after the
        last token and after each drafted one; token: what the sampler drew from the first.
        While the drawn token equals the drafted one, that token's cells are already right and
        the next row is drawn from (with the sampler's state after it, as plain decoding); the
        first that differs, or the row after the last draft, ends the run. At temperature 0
        this is exactly plain decoding; above it, each token is still drawn from the target's
        own distribution given the tokens before it, so the output's distribution is too."""
        seq, draft = p.seq, p.draft
        accepted = 0
        while True:
            matches = accepted < len(draft) and token == draft[accepted]
            seq.draft_accepted += matches
            self._emit(seq, rows[accepted], token)
            if not matches or seq not in self._active:
                break
            # the drafted token is in the cache already: it is an input, no longer pending
            del seq.pending[-1], seq.groups[-1], seq.carried[-1]
            seq.slot.inputs.append(token)
            accepted += 1
            token = sample_rows([seq.sampler], rows[accepted : accepted + 1])[0]
        if seq in self._active:  # (a finished one's went with its slot)
            self.cache.remove(seq.slot.id, len(seq.slot.inputs), None)  # the rejected cells

    def _logprob(self, row: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
        lp, top = logprobs(row, token, top_n)
        return TokenLogprob(self._text(token), lp, tuple((self._text(t), v) for t, v in top))

    def _text(self, token: int) -> str:
        return self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def _pool(self, p: Part, hidden: torch.Tensor) -> None:
        """Adds an embedding sequence's hidden states; its embedding, or its score where the
        model ranks, once its prompt is done."""
        seq = p.seq
        seq.pooled = self._pooler.add(seq.pooled, hidden[p.output : p.output + p.count])
        if not seq.pending:
            seq.first_token = _now()
            pooled = self._pooler.result(seq.pooled, len(seq.prompt))
            score = self._pooler.score(pooled)
            if score is None:
                self._finish(seq, STOP, embedding=pooled.tolist())
            else:
                self._finish(seq, STOP, score=score)

    def _finish(
        self,
        seq: Sequence,
        reason: str,
        *,
        embedding: list[float] | None = None,
        score: float | None = None,
    ) -> None:
        if reason != STOP or not seq.stops.is_stopped:  # text held back is final now
            tail = seq.stops.push(seq.decoder.flush()) + seq.stops.flush()
            if tail or seq.held_logprobs:
                seq.send(Piece(tail, tuple(seq.held_logprobs)))
        seq.held_logprobs.clear()
        self._release(seq)
        seq.done(reason, embedding=embedding, score=score)

    def _fail(self, seq: Sequence, message: str) -> None:
        self.cache.remove(seq.slot.id, 0, None)  # its cells may hold half a batch
        seq.slot.cut(0)
        self._release(seq)
        seq.fail(message)

    def _release(self, seq: Sequence) -> None:
        if seq in self._active:
            self._active.remove(seq)
            # its cells are its inputs (before its Done goes out): none of a drafted run
            self.cache.remove(seq.slot.id, len(seq.slot.inputs), None)
            self.inputs.release(seq.slot)


def _masks(parts: list[Part]) -> dict[int, torch.Tensor]:
    """The grammar mask of each part's row."""
    masks = {}
    for p in parts:
        assert p.seq.grammar is not None
        masks[id(p)] = p.seq.grammar.mask()
    return masks


def _now() -> int:
    return time.perf_counter_ns()
