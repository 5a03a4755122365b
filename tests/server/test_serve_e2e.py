"""`ember serve` as a real process on a free loopback port, driven by the real `ollama` and
`openai` clients with the bundled SmolLM2 (and Qwen2.5-Coder for one tool call). Adapted from
Ollama's integration tests: keywords, num_predict, context exhaustion, logprobs, concurrency,
the queue limit, a killed runner; plus the Host check, the API key and Open WebUI's load forms."""

import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import psutil
import pytest
from serve_process import Server

from ember.catalog import ModelChecksumError, resolve_model
from ember.errors import ModelNotFoundError
from ember.server.errors import MAX_QUEUE_MESSAGE

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]

MODEL = "smollm2:135m"
TOOLS_MODEL = "qwen2.5-coder:0.5b"
NUM_PARALLEL = 2
BLUE_SKY = "why is the sky blue? Be brief but factual in your reply"
# Ollama's integration keywords for the blue-sky prompt
BLUE_SKY_WORDS = (
    "rayleigh",
    "scatter",
    "atmosphere",
    "nitrogen",
    "oxygen",
    "wavelength",
    "interact",
)
GREEDY = {"temperature": 0, "seed": 42}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require(MODEL)
    s = Server(tmp_path_factory.mktemp("serve"), EMBER_NUM_PARALLEL=str(NUM_PARALLEL))
    yield s
    runners = s.runner_pids()
    s.stop()
    assert not any(psutil.pid_exists(pid) for pid in runners)  # they end with the server


@pytest.fixture(scope="module")
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", timeout=120)


def require(name: str) -> None:
    try:
        resolve_model(name)
    except ModelChecksumError:
        raise
    except ModelNotFoundError as err:
        pytest.skip(str(err))


def has_keyword(text: str, words: tuple[str, ...] = BLUE_SKY_WORDS) -> bool:
    return any(word in text.lower() for word in words)


def test_blue_sky_generate(client):
    r = client.generate(MODEL, BLUE_SKY, options={**GREEDY, "num_predict": 60})
    assert has_keyword(r.response), r.response
    assert r.model == MODEL and r.done and r.done_reason in ("stop", "length")
    assert r.total_duration and r.load_duration and r.prompt_eval_duration and r.eval_duration
    assert r.prompt_eval_count and r.prompt_eval_count > 10 and r.eval_count
    assert r.context and len(r.context) > r.prompt_eval_count


def test_blue_sky_chat_streams(client):
    messages = [{"role": "user", "content": BLUE_SKY}]
    parts = list(client.chat(MODEL, messages, stream=True, options={**GREEDY, "num_predict": 60}))
    text = "".join(p.message.content or "" for p in parts)
    assert has_keyword(text), text
    assert len(parts) > 5 and all(p.model == MODEL for p in parts)
    final = parts[-1]
    assert final.done and final.done_reason and final.eval_count and final.total_duration


def test_ps_lists_the_loaded_model(client):
    [running] = client.ps().models
    assert running.model == MODEL and running.size and running.digest
    assert running.details and running.details.family == "llama"
    assert running.expires_at and running.context_length == 2048


def test_num_predict_gives_exactly_that_many_tokens(client):
    options = {"num_predict": 10, "temperature": 0}
    r = client.generate(MODEL, "Write a long poem.", options=options, logprobs=True)
    assert r.eval_count == 10 and r.done_reason == "length"
    assert r.logprobs is not None and len(r.logprobs) == 10


def test_logprobs_shape_and_order(client):
    messages = [{"role": "user", "content": "Name a colour."}]
    r = client.chat(MODEL, messages, options={"num_predict": 8}, logprobs=True, top_logprobs=5)
    assert r.logprobs
    for entry in r.logprobs:
        assert entry.token and entry.logprob <= 0
        values = [t.logprob for t in entry.top_logprobs or []]
        assert 0 < len(values) <= 5 and values == sorted(values, reverse=True)
    assert client.chat(MODEL, messages, options={"num_predict": 3}).logprobs is None
    r = client.chat(MODEL, messages, options={"num_predict": 3}, logprobs=True, top_logprobs=0)
    assert r.logprobs and all(not e.top_logprobs for e in r.logprobs)


def test_format_with_a_json_schema(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    prompt = "Describe a person as JSON with a name and an age."
    r = client.generate(MODEL, prompt, format=schema, options={**GREEDY, "num_predict": 80})
    value = json.loads(r.response)
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_think_on_a_model_that_cannot_is_400(client):
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(MODEL, [{"role": "user", "content": "hi"}], think=True)
    assert err.value.status_code == 400
    assert err.value.error == f'"{MODEL}" does not support thinking'


def test_unknown_model_is_404(client):
    with pytest.raises(ollama.ResponseError) as err:
        client.generate("no-such-model", "hi")
    assert err.value.status_code == 404 and "not found" in err.value.error


def test_embed_batch_is_normalised(client):
    r = client.embed(MODEL, ["The sky is blue.", "Grass is green."])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576
    for vector in r.embeddings:
        assert math.fsum(x * x for x in vector) == pytest.approx(1.0, abs=1e-4)
    assert r.prompt_eval_count and r.prompt_eval_count > 4
    assert len(client.embed(MODEL, "hi", dimensions=8).embeddings[0]) == 8
    legacy = client.embeddings(MODEL, "The sky is blue.").embedding
    assert len(legacy) == 576 and math.fsum(x * x for x in legacy) > 1.5  # not normalised


def test_concurrent_chats_all_succeed(client):
    results: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            messages = [{"role": "user", "content": BLUE_SKY}]
            r = client.chat(MODEL, messages, options={**GREEDY, "num_predict": 40})
            results.append(r.message.content or "")
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(NUM_PARALLEL + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == NUM_PARALLEL + 1
    assert all(has_keyword(text) for text in results), results


def test_openai_chat_stream_and_embeddings(oai):
    messages: Any = [{"role": "user", "content": BLUE_SKY}]
    r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0)
    assert has_keyword(r.choices[0].message.content or "")
    assert r.usage and r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=20,
        temperature=0,  # sampled, the model may end before 20 tokens
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage and chunks[-1].usage.completion_tokens == 20
    e = oai.embeddings.create(model=MODEL, input=["a", "b"])
    assert len(e.data) == 2 and len(e.data[0].embedding) == 576
    b64 = oai.embeddings.create(model=MODEL, input="a", encoding_format="base64")
    assert b64.data[0].embedding  # the client decodes base64 itself
    assert MODEL in [m.id for m in oai.models.list()]


def test_openai_json_schema_response_format(oai):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name the capital of France as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        max_tokens=40,
        temperature=0,
    )
    assert isinstance(json.loads(r.choices[0].message.content or "")["city"], str)


def test_openai_errors(oai):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )


def test_tool_call_with_qwen(client):
    require(TOOLS_MODEL)
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "the city"}},
                "required": ["location"],
            },
        },
    }
    messages = [
        {"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}
    ]
    r = client.chat(
        TOOLS_MODEL, messages, tools=[tool], options={**GREEDY, "num_predict": 60}, keep_alive=0
    )
    calls = r.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather"
    assert "paris" in str(calls[0].function.arguments.get("location", "")).lower()


def test_host_header_of_another_site_is_403(server):
    r = httpx.get(f"{server.url}/api/version", headers={"Host": "evil.example"})
    assert r.status_code == 403 and "error" in r.json()


def test_open_webui_load_and_unload_forms(client, server):
    r = client.generate(MODEL, "")
    assert r.done and r.done_reason == "load"
    assert [m.model for m in client.ps().models] == [MODEL]
    r = client.chat(MODEL, [], keep_alive=0)
    assert r.done and r.done_reason == "unload"
    assert client.ps().models == []
    deadline = time.monotonic() + 10
    while server.runner_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.runner_pids() == []  # the process is gone, and its memory with it


def test_context_exhaustion_keeps_generating(client):
    prompt = "Write a very long story about a dragon and a knight, with many chapters."
    r = client.generate(MODEL, prompt, options={"num_ctx": 128, "num_predict": 200, "seed": 7})
    assert r.eval_count == 200 and r.done_reason == "length"  # past num_ctx: the context shifted
    assert len(r.response.split()) > 50
    assert client.ps().models[0].context_length == 128


def test_a_killed_runner_fails_its_request_and_the_next_one_works(client, server):
    stream = client.generate(
        MODEL, "Tell me a long story.", stream=True, options={"num_predict": 400}
    )
    first = next(stream)
    assert not first.done
    [pid] = server.runner_pids()
    psutil.Process(pid).kill()
    with pytest.raises(ollama.ResponseError) as err:
        for _ in stream:
            pass
    assert "runner has unexpectedly stopped" in err.value.error
    r = client.generate(MODEL, BLUE_SKY, options={**GREEDY, "num_predict": 40})
    assert has_keyword(r.response) and server.runner_pids() != [pid]


# --- a second server: a queue of 4, one request at a time, and an API key ---

KEY = "secret-key"


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require(MODEL)
    s = Server(
        tmp_path_factory.mktemp("strict"),
        EMBER_NUM_PARALLEL="1",
        EMBER_MAX_QUEUE="4",
        EMBER_API_KEY=KEY,
    )
    yield s
    s.stop()


def test_every_route_needs_the_api_key(strict_server):
    for path in ("/", "/api/version", "/api/ps", "/v1/models"):
        assert httpx.get(strict_server.url + path).status_code == 401
    r = httpx.post(f"{strict_server.url}/api/generate", json={"model": MODEL})
    assert r.status_code == 401 and "error" in r.json()
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{strict_server.url}/api/version", headers=auth).status_code == 200


def test_requests_past_the_queue_get_503_and_the_others_finish(strict_server):
    client = ollama.Client(
        host=strict_server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    )
    assert client.generate(MODEL, "").done_reason == "load"
    outcomes: list[Any] = []

    def one() -> None:
        try:
            r = client.generate(MODEL, "Count to twenty.", options={"num_predict": 40})
            outcomes.append(r.eval_count)
        except ollama.ResponseError as err:
            outcomes.append(err)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    refused = [o for o in outcomes if isinstance(o, ollama.ResponseError)]
    finished = [o for o in outcomes if isinstance(o, int) and 0 < o <= 40]
    assert len(outcomes) == 10 and len(refused) + len(finished) == 10
    assert refused and len(finished) >= 5  # one running and four waiting, at the least
    assert all(err.status_code == 503 and err.error == MAX_QUEUE_MESSAGE for err in refused)


def test_langchain_ollama_chats_and_streams(server: Server) -> None:
    chat_ollama = pytest.importorskip("langchain_ollama")
    llm = chat_ollama.ChatOllama(
        model=MODEL, base_url=server.url, temperature=0, num_predict=24, seed=42
    )
    answer = llm.invoke("Name one colour of the rainbow.")
    assert isinstance(answer.content, str) and answer.content.strip()
    assert answer.usage_metadata and answer.usage_metadata["output_tokens"] > 0
    pieces = [chunk.content for chunk in llm.stream("Name one colour of the rainbow.")]
    assert len(pieces) > 1 and "".join(pieces) == answer.content


def test_langchain_ollama_completion_and_structured_output(server: Server) -> None:
    # OllamaLLM sends "format": "" on every request (a 400 until Ember read it as Ollama does);
    # with_structured_output sends the pydantic model's JSON schema as the format
    lc = pytest.importorskip("langchain_ollama")
    pydantic = pytest.importorskip("pydantic")
    completion = lc.OllamaLLM(model=MODEL, base_url=server.url, num_predict=8, **GREEDY)
    text = completion.invoke("1, 2, 3,")
    assert isinstance(text, str) and text.strip()

    class Person(pydantic.BaseModel):
        name: str
        age: int

    chat = lc.ChatOllama(model=MODEL, base_url=server.url, num_predict=48, **GREEDY)
    person = chat.with_structured_output(Person).invoke("Ann is 30 years old. Who is she?")
    assert isinstance(person, Person)


# SmolLM2's ChatML turns as an Ollama Modelfile writes them: a Go template
CHATML_GO = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)


def test_a_modelfile_go_template_renders_as_the_models_own(client, server):
    # the same turns through the GGUF's Jinja template and through a Go TEMPLATE: the same
    # prompt, so the same greedy answer
    client.create(model="chatml-go:1", from_=MODEL, template=CHATML_GO)
    assert client.show("chatml-go:1").template == CHATML_GO
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": BLUE_SKY}]
    rendered = []
    for model in (MODEL, "chatml-go:1"):
        body = {"model": model, "messages": messages, "_debug_render_only": True}
        r = httpx.post(f"{server.url}/api/chat", json=body, timeout=120)
        rendered.append(r.json()["_debug_info"]["rendered_template"])
    assert rendered[0] == rendered[1]
    assert rendered[1].endswith(f"user\n{BLUE_SKY}<|im_end|>\n<|im_start|>assistant\n")
    options = {**GREEDY, "num_predict": 24}
    answers = [
        client.chat(m, messages, options=options).message.content for m in (MODEL, "chatml-go:1")
    ]
    assert answers[0] == answers[1] and answers[0]
    # a request's own Go template, through the ollama client
    r = client.generate(MODEL, "1, 2, 3,", template="{{ .Prompt }}", options=options)
    assert r.response.strip()
    with pytest.raises(ollama.ResponseError, match="does not parse"):
        client.generate(MODEL, "x", template="{{ .Prompt ", options=options)
    client.delete("chatml-go:1")


# the same turns, showing a past answer's thinking: Ember reads <think> tags from it
CHATML_THINK_GO = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{ if .Thinking }}<think>{{ .Thinking }}</think>\n{{ end }}{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)


def test_a_thinking_models_format_holds_after_its_thinking(client):
    # the format becomes a grammar that lets the model think first (one compiled on SmolLM2's
    # real vocabulary here); SmolLM2 does not think, so it answers the format at once
    client.create(model="smol-think:1", from_=MODEL, template=CHATML_THINK_GO)
    assert "thinking" in (client.show("smol-think:1").capabilities or [])
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    question = [{"role": "user", "content": "Ann is 30 years old. Give her name and age."}]
    options = {**GREEDY, "num_predict": 64}
    for think in (True, False):
        r = client.chat("smol-think:1", question, format=schema, think=think, options=options)
        answer = json.loads(r.message.content)
        assert set(answer) == {"name", "age"} and isinstance(answer["age"], int)
        assert r.done_reason == "stop"
    client.delete("smol-think:1")


def test_a_stop_ends_the_server_soon_though_a_stream_runs_on(tmp_path: Path) -> None:
    """SIGTERM with a generation in flight that would run for minutes: the server exits after
    its grace (it had waited for every stream to end), its runner with it."""
    require(MODEL)
    s = Server(tmp_path)
    client = ollama.Client(host=s.url, timeout=120)
    counting = {"num_predict": 100_000, "temperature": 0}  # greedy counting runs for minutes
    stream = client.generate(MODEL, "1, 2, 3, 4, 5, 6, 7, 8,", raw=True, stream=True,
                             options=counting)  # fmt: skip
    next(iter(stream))  # generating
    runners = s.runner_pids()
    start = time.monotonic()
    s.process.terminate()
    s.process.wait(60)
    assert time.monotonic() - start < 15
    assert runners and not any(psutil.pid_exists(pid) for pid in runners)
    s.log.close()
