"""Generation's generators, through a real uvicorn server: the server closes each one itself,
down to the runner's stream, whether the answer ended or its client went away, and leaves none
to the garbage collector. The collector's finalizers close each generator of a chain on its
own, while an outer one's close may still await an inner one's: "aclose(): asynchronous
generator is already running" in the server's log (the soak test saw it), and a runner stream
held open until a collection."""

import asyncio
import gc
import logging
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx
import pytest
from server_fakes import FakeRunner, FakeStarter, fake_state, served_in_thread

from ember.server.app import create_app

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
ROUTES = [
    ("/api/chat", CHAT),
    ("/api/generate", {"model": "fake", "prompt": "hi"}),
    ("/v1/chat/completions", {**CHAT, "stream": True}),
    ("/v1/completions", {"model": "fake", "prompt": "hi", "stream": True}),
    ("/v1/chat/completions", {**CHAT, "stream": True, "n": 2}),  # two runner streams at once
    ("/v1/completions", {"model": "fake", "prompt": "hi", "stream": True, "n": 3}),
    ("/v1/messages", {**CHAT, "max_tokens": 100, "stream": True}),
    ("/v1/responses", {"model": "fake", "input": "hi", "stream": True}),
]


class EndlessRunner(FakeRunner):
    """Streams long pieces as fast as they are read until its consumer closes the stream, when
    `endless`; else FakeRunner's answer. Counts the streams it opened and closed."""

    endless = True

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.opened = self.closed = 0

    async def completion(self, prompt: str, **fields: Any) -> AsyncGenerator[dict[str, Any], None]:
        self.opened += 1
        try:
            if not self.endless:
                async for record in super().completion(prompt, **fields):
                    yield record
                return
            while True:
                await asyncio.sleep(0)
                yield {"content": " word" * 4000}
        finally:
            self.closed += 1
            await asyncio.sleep(0.01)  # as httpx's close of a runner's stream, it awaits


class Starter(FakeStarter):
    async def __call__(self, path: str) -> FakeRunner:
        runner = EndlessRunner(path)
        self.runners.append(runner)
        return runner


Live = tuple[str, Starter, list[str]]


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    """A real uvicorn server over the fake state, in a thread; what went wrong: each of Ember's
    generators that reached the event loop's finalizer unclosed, and each ERROR record."""
    wrong: list[str] = []
    finalize = asyncio.BaseEventLoop._asyncgen_finalizer_hook  # type: ignore[attr-defined]

    def finalizer(loop: asyncio.AbstractEventLoop, agen: Any) -> None:
        if "/ember/" in agen.ag_code.co_filename:
            wrong.append(f"left to the collector: {agen.__qualname__}")
        finalize(loop, agen)

    # set before the server's loop starts, which takes its finalizer from its class
    monkeypatch.setattr(asyncio.BaseEventLoop, "_asyncgen_finalizer_hook", finalizer)
    starter = Starter()
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: wrong.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        with served_in_thread(create_app(fake_state(starter))) as url:
            yield url, starter, wrong
    finally:
        logging.getLogger().removeHandler(handler)


def _wait(condition: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _collected(wrong: list[str]) -> list[str]:
    gc.collect()
    time.sleep(0.1)  # the server's loop runs what the finalizers scheduled
    return wrong


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_a_stream_cut_by_its_client_is_closed_at_once_down_to_the_runner(
    live: Live, path: str, body: dict[str, Any]
) -> None:
    url, starter, wrong = live
    gc.disable()  # nothing is closed by a collection before the checks
    try:
        for _ in range(3):
            with (
                httpx.Client(base_url=url, timeout=10) as http,
                http.stream("POST", path, json=body) as response,
            ):
                assert response.status_code == 200
                lines = (line for line in response.iter_lines() if line)  # SSE: blank between
                assert next(lines) and next(lines)
                time.sleep(0.3)  # the server's writes fill the socket: it waits at a send
            # the client went away with its stream still going
        # a third choice waits for a slot (fake_state's two) that no endless stream frees
        runner, opened = starter.runners[0], 3 * min(body.get("n", 1), 2)
        assert runner.opened == opened
        assert _wait(lambda: runner.closed == opened), "a runner stream was left open"
    finally:
        gc.enable()
    assert _collected(wrong) == []


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_an_answer_that_ends_closes_every_generator_it_opened(
    live: Live, path: str, body: dict[str, Any], stream: bool
) -> None:
    url, starter, wrong = live
    EndlessRunner.endless = False
    try:
        gc.disable()
        with httpx.Client(base_url=url, timeout=10) as http:
            for _ in range(3):
                answer = http.post(path, json={**body, "stream": stream})
                assert answer.status_code == 200 and "friend" in answer.text
        runner, opened = starter.runners[0], 3 * body.get("n", 1)
        assert runner.opened == opened
        assert _wait(lambda: runner.closed == opened), "a runner stream was left open"
    finally:
        EndlessRunner.endless = True
        gc.enable()
    assert _collected(wrong) == []
