"""The embeddable Python API: `LLM("smollm2:135m").generate("Why is the sky blue?")`, no server.

It runs on the same engine as the runner process, so several threads may generate at once:
their sequences share the batches of one loop.
"""

import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ember.backend.threads import in_fresh_thread
from ember.catalog import resolve_model
from ember.errors import GenerationError
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.memory import release_free_heap
from ember.runner.sequence import Done, Piece, Request, Sequence, TokenLogprob
from ember.sample.grammar import Grammar
from ember.template import BUILTIN, render_chat
from ember.tokenizer import Tokenizer

__all__ = ["LLM", "GenerateResult", "TokenLogprob", "TokenStream"]


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
    logprobs: list[TokenLogprob]  # one per generated token when asked for, else empty
    # speculative decoding (options draft_ngram): tokens drafted and those accepted; None: off
    draft_proposed: int | None = None
    draft_accepted: int | None = None


class LLM:
    """A loaded model. `model` is a bundled name (smollm2:135m, gemma3:270m,
    qwen2.5-coder:0.5b) or a path to a GGUF file. num_parallel sequences run at once (more
    wait for a free slot); num_ctx and num_batch come from each request's options, and a
    request with other values reloads the engine once the running ones are done."""

    def __init__(
        self, model: str, *, num_threads: int | None = None, num_parallel: int = 4
    ) -> None:
        start = time.perf_counter_ns()
        for name, value in (("num_parallel", num_parallel), ("num_threads", num_threads or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.path = resolve_model(model)
        self.gguf = GGUFFile.open(self.path)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        self.model = in_fresh_thread(lambda: load_model(self.gguf))  # see backend/threads.py
        release_free_heap()  # the vocabulary's build and the file's parse left much behind
        self.num_parallel = num_parallel
        template = self.gguf.metadata.get("tokenizer.chat_template")
        arch = self.gguf.metadata.get("general.architecture", "")
        self.template = template if isinstance(template, str) else BUILTIN.get(arch)
        self._lock = threading.Lock()  # guards the engine's replacement
        self._box = _EngineBox()  # the engine is made (and its memory reserved) on first use
        self._size = (0, 0)
        # an LLM let go without close() must not keep its KV cache and loop thread: the
        # engine's thread holds the engine, never the LLM, so the box is closed with the LLM
        weakref.finalize(self, self._box.close)
        self.load_duration = time.perf_counter_ns() - start

    def engine_for(self, opts: Options) -> Engine:
        """The engine sized for opts' num_ctx and num_batch, reloaded when they change."""
        size = (opts.num_ctx, opts.num_batch)
        with self._lock:
            engine = self._box.engine
            if engine is None or size != self._size:
                if engine is not None:
                    while engine.busy():  # as a scheduler: let the running ones finish (close()
                        time.sleep(0.01)  # ends them at once)
                    self._box.close()
                engine = Engine(
                    self.model,
                    self.tokenizer,
                    num_parallel=self.num_parallel,
                    num_ctx=opts.num_ctx,
                    num_batch=opts.num_batch,
                )
                self._box.engine, self._size = engine, size
            return engine

    def close(self) -> None:
        """Ends the engine (its KV cache and thread); a later call makes a new one. Not behind
        the lock: a reload waiting for the engine's running requests ends its wait here."""
        self._box.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def prompt_ids(self, prompt: str, *, raw: bool = False) -> list[int]:
        """The tokens of prompt as sent (raw) or as one user message in the chat template."""
        if raw or self.template is None:
            return self.tokenizer.encode(prompt)
        bos = self.tokenizer.bos_id
        bos_text = (
            self.tokenizer.token_bytes(bos).decode("utf-8", "replace") if bos is not None else ""
        )
        eos = min(self.tokenizer.eos_ids, default=0)
        eos_text = self.tokenizer.token_bytes(eos).decode("utf-8", "replace")
        text = render_chat(
            self.template,
            [{"role": "user", "content": prompt}],
            bos_token=bos_text,
            eos_token=eos_text,
        )
        # a template that writes the BOS token itself must not get a second one
        return self.tokenizer.encode(text, add_special=not (bos_text and text.startswith(bos_text)))

    def generate(
        self,
        prompt: str,
        *,
        raw: bool = False,
        options: dict[str, Any] | None = None,
        stream: bool = False,
        format: str | dict[str, Any] | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
    ) -> "GenerateResult | TokenStream":
        """The completion of prompt. With stream=True, an iterator of text pieces whose
        `result` attribute holds the GenerateResult once it is exhausted. format constrains
        the output: "json", a JSON schema, {"regex": ...} or {"lark": ...}. logprobs adds each
        generated token's log probability, with the top_logprobs (0-20) most likely ones."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        opts = Options.parse(options)
        if format == "":  # as Ollama's: "" (like null) is no format
            format = None
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int):
            raise TypeError(f"top_logprobs must be an int, got {top_logprobs!r}")
        if not 0 <= top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be within [0, 20], got {top_logprobs}")
        grammar = Grammar.from_format(format, self.tokenizer) if format is not None else None
        request = Request(
            self.prompt_ids(prompt, raw=raw),
            opts,
            grammar=grammar,
            logprobs=logprobs or top_logprobs > 0,
            top_logprobs=top_logprobs,
        )
        tokens = TokenStream(self.engine_for(opts).submit(request))
        if stream:
            return tokens
        for _ in tokens:
            pass
        assert tokens.result is not None
        return tokens.result


class _EngineBox:
    """The LLM's current engine, apart from the LLM so that a finalizer may close it."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


class TokenStream:
    """The text pieces of a generation as they come; `result` holds the GenerateResult once the
    iteration has ended. It iterates once (again: nothing). Leaving the iteration early, or
    dropping a stream never iterated, cancels the generation."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.result: GenerateResult | None = None
        self._iterated = False

    def __del__(self) -> None:
        if self.result is None:  # never iterated, or left early: nobody will read the rest
            self.seq.cancel()

    def __iter__(self) -> Iterator[str]:
        if self._iterated:  # its events were read: a second pass would wait forever
            return
        self._iterated = True
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        try:
            while True:
                event = self.seq.events.get()
                if isinstance(event, Piece):
                    logprobs += event.logprobs
                    if event.text:
                        text.append(event.text)
                        yield event.text
                    continue
                self.result = _result(event, "".join(text), self.seq, logprobs)
                return
        finally:
            if self.result is None:
                self.seq.cancel()


def _result(done: Done, text: str, seq: Sequence, logprobs: list[TokenLogprob]) -> GenerateResult:
    if done.error is not None:
        raise GenerationError(done.error)
    return GenerateResult(
        text=text,
        tokens=list(seq.generated),
        done_reason=done.done_reason,
        # the whole prompt, a cached prefix included, as Ollama and the server report it
        prompt_eval_count=done.prompt_count,
        prompt_eval_duration=done.prompt_eval_duration,
        eval_count=done.eval_count,
        eval_duration=done.eval_duration,
        total_duration=done.prompt_eval_duration + done.eval_duration,
        logprobs=logprobs,
        draft_proposed=done.draft_proposed,
        draft_accepted=done.draft_accepted,
    )
