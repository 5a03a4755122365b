"""Fakes for server tests without a model: a runner that answers from a script, a model resolver
with a hand-written template, and a state wiring them to a real Scheduler."""

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn

from ember.runner.client import LoadSettings, RunnerError, free_port
from ember.server.errors import not_found
from ember.server.model import ServedModel
from ember.server.prompt import ChatTemplate
from ember.server.scheduler import Defaults, Scheduler
from ember.server.state import ServerState
from ember.server.thinking import THINK
from ember.server.tools import ToolCallFormat

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if tools %}<tools>{{ tools | length }}</tools>{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
THINKING_TEMPLATE = (
    "{% for m in messages %}{% if m['thinking'] %}<think>{{ m['thinking'] }}</think>{% endif %}"
    "{{ m['content'] }}\n{% endfor %}"
)


class FakeRunner:
    """Answers every completion with `reply` split into words (one record a word), after
    waiting for `gate` when one is set. Records what it was asked."""

    def __init__(
        self,
        path: str,
        *,
        reply: str = "Hello there friend",
        fits: int = 64,
        load_gate: asyncio.Event | None = None,
    ) -> None:
        self.path = path
        self.reply = reply
        self.fits = fits  # the largest parallel a load accepts (more: 507)
        self.settings: LoadSettings | None = None
        self.prompts: list[str] = []
        self.fields: list[dict[str, Any]] = []
        self.is_alive = True
        self.gate: asyncio.Event | None = None
        self.load_gate = load_gate  # a load waits for it
        self.error: str | None = None  # an error record instead of the final one

    async def load(self, settings: LoadSettings) -> dict[str, Any]:
        if self.load_gate is not None:
            await self.load_gate.wait()
        if settings.parallel > self.fits:
            raise RunnerError("does not fit", 507)
        self.settings = settings
        num_ctx = settings.kv_size // settings.parallel
        kv_type = settings.kv_cache_type or "f16"
        return {"success": True, "num_ctx": num_ctx, "kv_bytes": 1, "kv_cache_type": kv_type}

    async def completion(self, prompt: str, **fields: Any) -> AsyncGenerator[dict[str, Any], None]:
        self.prompts.append(prompt)
        self.fields.append(fields)
        if self.gate is not None:
            await self.gate.wait()
        if not self.is_alive:
            raise RunnerError("the runner stopped (exit code -9)", 500)
        limit = (fields.get("options") or {}).get("num_predict", -1)
        words = self.reply.split(" ")
        words = words[:limit] if limit >= 0 else words
        for i, word in enumerate(words):
            record: dict[str, Any] = {"content": word if i == 0 else " " + word}
            if fields.get("logprobs"):
                top = [{"token": word, "logprob": -0.5}, {"token": "x", "logprob": -2.0}]
                record["logprobs"] = [{"token": word, "logprob": -0.5, "top_logprobs": top}]
            yield record
        if self.error:
            yield {"error": self.error}
            return
        final = {
            "done": True,
            "done_reason": "length" if limit >= 0 and limit < len(self.reply.split()) else "stop",
            "prompt_count": len(prompt.split()),
            "prompt_cached_count": max(0, len(prompt.split()) - 1),
            "prompt_eval_count": 1,
            "prompt_eval_duration": 10,
            "eval_count": len(words),
            "eval_duration": 20,
        }
        if (fields.get("options") or {}).get("draft_ngram"):  # as the runner: when drafting
            final.update(draft_proposed=len(words), draft_accepted=len(words) - 1)
        yield final

    async def health(self) -> dict[str, Any]:
        """As the runner's /health once loaded: a cell per prompt word it was asked."""
        parallel = self.settings.parallel if self.settings else 1
        used = sum(len(p.split()) for p in self.prompts)
        total = self.settings.kv_size if self.settings else 0
        return {"status": "ready", "kv_cells_used": used, "kv_cells": total, "num_slots": parallel}

    async def embedding(
        self, content: str | list[str], *, truncate: bool = True, cut_to: int = 0
    ) -> dict[str, Any]:
        self.cut_to = cut_to
        texts = [content] if isinstance(content, str) else content
        vectors = [[float(len(t)), 0.0, 3.0, 4.0] for t in texts]
        if isinstance(content, str):
            return {"embedding": vectors[0], "prompt_eval_count": 1}
        return {"embeddings": vectors, "prompt_eval_count": len(texts)}

    async def rerank(
        self, query: str, documents: list[str], *, truncate: bool = True
    ) -> dict[str, Any]:
        """Each document's score is its length (a longer one ranks higher)."""
        count = sum(len(query.split()) + len(d.split()) for d in documents)
        return {"scores": [float(len(d)) for d in documents], "prompt_eval_count": count}

    async def tokenize(self, content: str, *, add_special: bool = True) -> list[int]:
        return list(range(len(content.split())))

    async def detokenize(self, tokens: list[int]) -> str:
        return " ".join(f"t{t}" for t in tokens)

    def alive(self) -> bool:
        return self.is_alive

    async def close(self) -> None:
        self.is_alive = False


class FakeStarter:
    """The scheduler's start function: makes FakeRunners and keeps them."""

    def __init__(self, **runner_args: Any) -> None:
        self.runner_args = runner_args
        self.runners: list[FakeRunner] = []

    async def __call__(self, path: str) -> FakeRunner:
        runner = FakeRunner(path, **self.runner_args)
        self.runners.append(runner)
        return runner


def served(name: str, *, template: str = TEMPLATE, **changes: Any) -> ServedModel:
    values: dict[str, Any] = dict(
        name=name,
        model_path=Path(f"/models/{name}.gguf"),
        template=ChatTemplate(template),
        parameters={},
        capabilities=frozenset({"completion"}),
        tool_format=ToolCallFormat("<tool_call>", "</tool_call>"),
        thinking_tags=None,
        digest="0" * 64,
        size=1000,
        modified_at=datetime(2025, 1, 1, tzinfo=UTC),
        details={"format": "gguf", "family": "fake"},
        context_length=8192,
    )
    values.update(changes)
    return ServedModel(**values)


MODELS = {
    "fake": served("fake"),
    "other": served("other"),
    "drafted": served("drafted", draft="other"),  # its Modelfile names a DRAFT model
    "tooly": served("tooly", capabilities=frozenset({"completion", "tools"})),
    "thinker": served(
        "thinker",
        template=THINKING_TEMPLATE,
        capabilities=frozenset({"completion", "thinking"}),
        thinking_tags=THINK,
    ),
    "ranker": served("ranker", capabilities=frozenset({"rerank"})),
}


class FakeModels:
    def __init__(self, models: dict[str, ServedModel] | None = None) -> None:
        self.models = models or MODELS

    def resolve(self, name: str) -> ServedModel:
        if name not in self.models:
            raise not_found(name)
        return self.models[name]

    def available(self) -> list[tuple[str, int, str]]:
        return [(m.name, 1735689600, "library") for m in self.models.values()]

    def store(self) -> None:
        return None


def fake_state(starter: FakeStarter | None = None, **scheduler_args: Any) -> ServerState:
    scheduler_args.setdefault("num_parallel", 2)
    scheduler = Scheduler(start=starter or FakeStarter(), defaults=Defaults(), **scheduler_args)
    return ServerState(FakeModels(), scheduler)  # type: ignore[arg-type]


@contextlib.contextmanager
def served_in_thread(app: Any, port: int | None = None) -> Iterator[str]:
    """app served by a real uvicorn on a loopback port (a free one when None), in a thread of
    its own; its URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
