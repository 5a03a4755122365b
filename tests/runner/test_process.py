"""The runner as the server drives it: a real `python -m ember runner` process over HTTP,
through ember.runner.client."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ember.runner.client import LoadSettings, RunnerClient, RunnerError

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# how the first test loads the tiny model, and the `loaded` fixture when a test runs alone
SETTINGS = LoadSettings(parallel=2, batch_size=16, kv_size=128)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def runner(tiny_models, loop) -> Iterator[RunnerClient]:
    client = loop.run_until_complete(RunnerClient.start(str(tiny_models["llama"].path)))
    yield client
    loop.run_until_complete(client.close())


@pytest.fixture
def loaded(runner: RunnerClient, loop) -> RunnerClient:
    """The runner with its model loaded: by the first test when the module runs whole, here
    when a test runs alone (-k)"""
    if loop.run_until_complete(runner.health())["status"] != "ready":
        loop.run_until_complete(runner.load(SETTINGS))
    return runner


async def records(client: RunnerClient, prompt: str, **fields: Any) -> list[dict[str, Any]]:
    return [r async for r in client.completion(prompt, **fields)]


def test_requests_before_load_are_refused_then_the_model_loads(runner, loop):
    health = loop.run_until_complete(runner.health())
    assert health["status"] == "launched"
    with pytest.raises(RunnerError, match="not ready") as err:
        loop.run_until_complete(runner.tokenize("hi"))
    assert err.value.status == 409
    loaded = loop.run_until_complete(runner.load(SETTINGS))
    assert loaded["success"] and loaded["num_ctx"] == 64
    assert loop.run_until_complete(runner.health())["status"] == "ready"
    with pytest.raises(RunnerError, match="already loaded"):
        loop.run_until_complete(runner.load(LoadSettings()))


@pytest.mark.usefixtures("loaded")
def test_completion_streams_pieces_then_a_final_record(runner, loop):
    out = loop.run_until_complete(
        records(
            runner,
            "hello world",
            options={"temperature": 0, "num_predict": 6},
            logprobs=True,
            top_logprobs=3,
        )
    )
    final = out[-1]
    assert final["done"] and final["done_reason"] in ("stop", "length")
    assert final["eval_count"] == sum(len(r.get("logprobs", [])) for r in out[:-1])
    assert final["prompt_eval_count"] >= 1 and final["eval_duration"] >= 0
    for r in out[:-1]:
        for lp in r.get("logprobs", []):
            assert len(lp["top_logprobs"]) == 3
            values = [t["logprob"] for t in lp["top_logprobs"]]
            assert values == sorted(values, reverse=True)


@pytest.mark.usefixtures("loaded")
def test_top_logprobs_without_logprobs_asks_for_none(runner, loop):
    # Ollama computes them only when logprobs is true
    opts = {"temperature": 0, "num_predict": 3}
    out = loop.run_until_complete(records(runner, "hello", options=opts, top_logprobs=3))
    assert out[-1]["eval_count"] > 0
    assert not any(r.get("logprobs") for r in out)


@pytest.mark.usefixtures("loaded")
def test_same_prompt_twice_reuses_the_cache(runner, loop):
    opts = {"temperature": 0, "num_predict": 3}
    first = loop.run_until_complete(records(runner, "the cat sat on the mat", options=opts))
    again = loop.run_until_complete(records(runner, "the cat sat on the mat", options=opts))
    # all cached, with the logits after it: nothing evaluated, the whole prompt counted
    final = again[-1]
    assert (final["prompt_eval_count"], final["prompt_cached_count"]) == (0, final["prompt_count"])
    text = "".join(r.get("content", "") for r in first[:-1])
    assert text == "".join(r.get("content", "") for r in again[:-1])


@pytest.mark.usefixtures("loaded")
def test_bad_requests_get_400_with_a_message(runner, loop):
    cases = [
        ({"options": {"repeat_last_n": -2}}, "repeat_last_n"),
        ({"options": {"bogus": 1}}, "unknown option"),
        ({"format": "yaml"}, "format"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"truncate": False, "options": {"num_ctx": 64}, "prompt": "word " * 200}, "exceeds"),
    ]
    for fields, message in cases:
        prompt = fields.pop("prompt", "hi")
        with pytest.raises(RunnerError, match=message) as err:
            loop.run_until_complete(records(runner, prompt, **fields))
        assert err.value.status == 400


@pytest.mark.usefixtures("loaded")
def test_closing_the_stream_cancels_the_generation(runner, loop):
    async def first_piece_then_close() -> None:
        stream = runner.completion("story", options={"num_predict": 100_000, "temperature": 1})
        async for record in stream:
            assert "content" in record
            break
        await stream.aclose()

    loop.run_until_complete(first_piece_then_close())
    assert loop.run_until_complete(wait_idle(runner)) == 0


async def wait_idle(runner: RunnerClient) -> int:
    for _ in range(100):
        if (await runner.health())["busy"] == 0:
            return 0
        await asyncio.sleep(0.05)
    return int((await runner.health())["busy"])


@pytest.mark.usefixtures("loaded")
def test_an_abandoned_embedding_frees_the_engine(runner, loop):
    """A caller that gives up on a big embed (the server's client went away) cancels every
    input still queued, where they all ran on and held the model's other requests."""

    async def give_up() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(runner.embedding([f"text {i}" for i in range(3000)]), 0.5)

    loop.run_until_complete(give_up())
    assert loop.run_until_complete(wait_idle(runner)) == 0


@pytest.mark.usefixtures("loaded")
def test_embedding_tokenize_detokenize(runner, loop):
    one = loop.run_until_complete(runner.embedding("hello"))
    many = loop.run_until_complete(runner.embedding(["hello", "world wide"]))
    assert len(one["embedding"]) == len(many["embeddings"][0])
    assert many["embeddings"][0] == pytest.approx(one["embedding"], abs=1e-4)
    tokens = loop.run_until_complete(runner.tokenize("hello world", add_special=False))
    assert loop.run_until_complete(runner.detokenize(tokens)) == "hello world"
    with pytest.raises(RunnerError, match="vocabulary"):
        loop.run_until_complete(runner.detokenize([10**9]))


def test_a_load_that_cannot_fit_fails_at_load_with_what_it_needs(tmp_path, loop):
    import tinymodels

    path = tmp_path / "huge-context.gguf"
    tinymodels.write_tiny_gguf("llama", path, max_position_embeddings=1 << 24)

    async def load() -> None:
        client = await RunnerClient.start(str(path))
        try:
            await client.load(LoadSettings(parallel=63, batch_size=512, kv_size=63 << 24))
        finally:
            await client.close()

    with pytest.raises(RunnerError, match=r"63 × 16777216 tokens of KV cache .* GiB") as err:
        loop.run_until_complete(load())
    assert err.value.status == 507
    assert str(err.value).startswith("model requires more system memory (")  # Ollama's words


def test_a_runner_that_cannot_start_says_why(tmp_path, loop):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)

    async def load() -> None:
        client = await RunnerClient.start(str(bad))
        try:
            await client.load(LoadSettings(kv_size=512))
        finally:
            await client.close()

    with pytest.raises(RunnerError) as err:
        loop.run_until_complete(load())
    assert err.value.status == 400
