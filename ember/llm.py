"""The embeddable Python API: `LLM("smollm2:135m").generate("Why is the sky blue?")`, no server."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from ember.catalog import resolve_model
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.options import Options
from ember.runner.generation import GenerateResult, Generation, Session
from ember.sample.grammar import Grammar
from ember.template import BUILTIN, render_chat
from ember.tokenizer import Tokenizer

__all__ = ["LLM", "GenerateResult", "TokenStream"]


class LLM:
    """A loaded model. `model` is a bundled name (smollm2:135m, gemma3:270m,
    qwen2.5-coder:0.5b) or a path to a GGUF file."""

    def __init__(self, model: str, *, num_threads: int | None = None) -> None:
        start = time.perf_counter_ns()
        if num_threads:
            torch.set_num_threads(num_threads)
        self.path = resolve_model(model)
        self.gguf = GGUFFile.open(self.path)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        self.session = Session(load_model(self.gguf), self.tokenizer)
        template = self.gguf.metadata.get("tokenizer.chat_template")
        arch = self.gguf.metadata.get("general.architecture", "")
        self.template = template if isinstance(template, str) else BUILTIN.get(arch)
        self.lock = threading.Lock()  # one generation at a time until the runner loop lands
        self.load_duration = time.perf_counter_ns() - start

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
    ) -> "GenerateResult | TokenStream":
        """The completion of prompt. With stream=True, an iterator of text pieces whose
        `result` attribute holds the GenerateResult once it is exhausted. format constrains
        the output: "json", a JSON schema, {"regex": ...} or {"lark": ...}."""
        opts = Options.parse(options)
        grammar = Grammar.from_format(format, self.tokenizer) if format is not None else None
        ids = self.prompt_ids(prompt, raw=raw)
        generation = Generation(self.session, ids, opts, grammar)
        if stream:
            return TokenStream(generation, self.lock)
        with self.lock:
            for _ in generation:
                pass
        assert generation.result is not None
        return generation.result


class TokenStream:
    """The text pieces of a generation, streamed while holding the model's lock; `result`
    holds the GenerateResult once the iteration has ended."""

    def __init__(self, generation: Generation, lock: threading.Lock) -> None:
        self.generation, self.lock = generation, lock

    @property
    def result(self) -> GenerateResult | None:
        return self.generation.result

    def __iter__(self) -> Iterator[str]:
        with self.lock:
            yield from self.generation
