"""The native routes over fake runners: response shapes, streaming, errors and their status
codes, the load and unload forms, thinking and tool calls parsed from output, embeddings."""

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ember.runner.client import RunnerError
from ember.server.errors import RUNNER_STOPPED_MESSAGE


def lines(response: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines() if line]


def chat(client: TestClient, **body: Any) -> Any:
    body.setdefault("model", "fake")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return client.post("/api/chat", json=body)


def test_root_and_version(client):
    assert client.get("/").text == "Ollama is running"
    assert client.head("/").status_code == 200
    assert client.get("/api/version").json()["version"].count(".") == 2


def test_generate_answers_with_metrics_and_context(client, starter):
    r = client.post("/api/generate", json={"model": "fake", "prompt": "why", "stream": False})
    assert r.status_code == 200
    body = r.json()
    assert body["response"] == "Hello there friend" and body["done"] is True
    assert body["done_reason"] == "stop" and body["model"] == "fake"
    answered = starter.runners[0].prompts[0] + body["response"]
    assert body["context"] == list(range(len(answered.split())))  # the fake: a token a word
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(body[key], int)
    # the whole prompt is reported, not only the tokens the runner evaluated
    assert body["prompt_eval_count"] == len(starter.runners[0].prompts[0].split()) > 1
    assert starter.runners[0].prompts[0] == "<user>why</user>\n<assistant>"


def test_a_runner_killed_after_its_final_record_fails_the_generate_with_its_message(
    client, starter, caplog
):
    """The context is counted by the runner after the answer: a runner killed in between (the
    soak's race) gives Ollama's message, not an internal error logged as a bug."""
    client.post("/api/generate", json={"model": "fake", "prompt": "why", "stream": False})
    runner = starter.runners[0]

    async def killed(content: str, *, add_special: bool = True) -> list[int]:
        runner.is_alive = False
        raise RunnerError("the runner stopped (exit code -9)", 500)

    runner.tokenize = killed  # type: ignore[method-assign]
    chunks = lines(client.post("/api/generate", json={"model": "fake", "prompt": "why"}))
    assert chunks[-1] == {"error": RUNNER_STOPPED_MESSAGE}
    assert "".join(c.get("response", "") for c in chunks) == "Hello there friend"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_generate_streams_ndjson_ending_with_the_final_chunk(client):
    r = client.post("/api/generate", json={"model": "fake", "prompt": "why"})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    chunks = lines(r)
    assert "".join(c["response"] for c in chunks) == "Hello there friend"
    assert [c["done"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["eval_count"] == 3
    assert r.text.startswith('{"model":"fake","created_at":')  # compact, as Go's encoder


def test_chat_streams_messages_and_logprobs(client):
    chunks = lines(chat(client, logprobs=True, top_logprobs=2))
    assert all(c["message"]["role"] == "assistant" for c in chunks)
    assert "".join(c["message"]["content"] for c in chunks) == "Hello there friend"
    entries = [lp for c in chunks for lp in c.get("logprobs", [])]
    assert len(entries) == 3
    assert entries[0]["bytes"] == list(b"Hello") and len(entries[0]["top_logprobs"]) == 2


def test_options_reach_the_runner_and_bad_ones_are_400(client, starter):
    options = {"num_predict": 2, "temperature": 0, "penalize_newline": 1}  # the last: ignored
    r = chat(client, stream=False, options=options)
    assert r.json()["message"]["content"] == "Hello there"
    assert r.json()["done_reason"] == "length"
    assert starter.runners[0].fields[0]["options"]["temperature"] == 0
    r = chat(client, options={"temperature": "hot"})
    assert r.status_code == 400 and "options.temperature" in r.json()["error"]
    r = chat(client, options={"repeat_last_n": -2})
    assert r.status_code == 400 and "repeat_last_n" in r.json()["error"]



# Numbers JSON cannot carry to Ollama's Go types nor to the runner (Python's decoder takes them:
# 1e999 and Infinity as inf, integers of any size): a 400 on every route, never a 500.
HI = '"messages": [{"role": "user", "content": "hi"}]'
BODIES = {  # FIELD: the field under test
    "/api/chat": '{"model": "fake", HI, "options": {FIELD}}',
    "/api/generate": '{"model": "fake", "prompt": "hi", "options": {FIELD}}',
    "/v1/chat/completions": '{"model": "fake", HI, FIELD}',
    "/v1/completions": '{"model": "fake", "prompt": "hi", FIELD}',
    "/v1/responses": '{"model": "fake", "input": "hi", FIELD}',
}


def body_with(path: str, field: str) -> str:
    return BODIES[path].replace("HI", HI).replace("FIELD", field)
FIELDS = ['"temperature": 1e999', '"top_p": NaN', '"seed": 18446744073709551616']


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("field", FIELDS)
def test_numbers_json_cannot_carry_are_400(client, path, field):
    content = body_with(path, field)
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_infinite_logit_bias_is_400(client, path):
    content = body_with(path, '"logit_bias": {"1": Infinity}')
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "finite" in r.text

@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "nope"}, 404, "model 'nope' not found"),
        ({"model": ""}, 400, "model is required"),
        ({"think": True}, 400, '"fake" does not support thinking'),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            400,
            '"fake" does not support tools',
        ),
        (
            {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            400,
            '"fake" does not support vision',
        ),
        ({"messages": "x"}, 400, "messages"),
        ({"top_logprobs": 21}, 400, "top_logprobs"),
    ],
)
def test_bad_chats_get_their_status_and_message(client, body, status, message):
    r = chat(client, **body)
    assert r.status_code == status
    assert message in r.json()["error"]


def test_bad_bodies_are_400_json(client):
    for raw in (b"", b"{", b"[1]", b'{"model": 3}'):
        r = client.post("/api/generate", content=raw)
        assert r.status_code == 400 and "error" in r.json()


def test_raw_with_a_system_prompt_is_400(client):
    body = {"model": "fake", "prompt": "x", "raw": True, "system": "s"}
    r = client.post("/api/generate", json=body)
    assert r.status_code == 400 and "raw mode" in r.json()["error"]


def test_empty_prompt_loads_and_keep_alive_zero_unloads(client):
    r = client.post("/api/generate", json={"model": "fake", "stream": False})
    assert r.json()["done_reason"] == "load"
    ps = client.get("/api/ps").json()["models"]
    assert [m["name"] for m in ps] == ["fake"] and ps[0]["context_length"] == 4096
    r = chat(client, messages=[], keep_alive=0, stream=False)
    assert r.json()["done_reason"] == "unload" and r.json()["message"]["content"] == ""
    assert client.get("/api/ps").json()["models"] == []


def test_the_load_and_unload_forms_answer_one_json_object_when_streamed(client):
    """Ollama answers them with c.JSON whatever `stream` says: Open WebUI's unload (stream left
    out) reads the answer with aiohttp's json(), which refused application/x-ndjson."""
    forms = [("/api/generate", {"prompt": ""}), ("/api/chat", {"messages": []})]
    for path, body in forms:
        for keep_alive in (None, 0):
            extra = {} if keep_alive is None else {"keep_alive": keep_alive}
            r = client.post(path, json={"model": "fake", **body, **extra})
            assert r.headers["content-type"].startswith("application/json"), (path, keep_alive)
            assert r.json()["done_reason"] == ("unload" if keep_alive == 0 else "load")


def test_an_error_mid_stream_ends_with_an_error_line(client, starter):
    chat(client, stream=False)  # loads the runner
    starter.runners[0].error = "boom"
    chunks = lines(chat(client))
    assert chunks[-1] == {"error": "boom"} and chunks[0]["message"]["content"] == "Hello"
    r = chat(client, stream=False)
    assert r.status_code == 500 and r.json() == {"error": "boom"}


def test_a_dead_runner_gives_a_clear_error_and_the_next_request_works(client, starter):
    chat(client, stream=False)
    starter.runners[0].is_alive = False
    r = chat(client, stream=False)
    assert r.status_code == 200  # found dead before the request: a new runner serves it
    assert len(starter.runners) == 2
    starter.runners[1].gate = None
    starter.runners[1].is_alive = False
    starter.runners[1].alive = lambda: True  # type: ignore[method-assign]  # dies mid-request
    r = chat(client, stream=False)
    assert r.status_code == 500 and r.json()["error"] == RUNNER_STOPPED_MESSAGE


def test_thinking_is_split_from_content(client, starter):
    starter.runner_args["reply"] = "<think>let me see</think> The answer"
    r = chat(client, model="thinker", stream=False, think=True)
    assert r.json()["message"]["thinking"] == "let me see"
    assert r.json()["message"]["content"] == "The answer"


def test_generates_context_holds_the_thinking_too(client, starter):
    # as Ollama's: the tokens of the prompt and the model's text as it came, thinking included
    starter.runner_args["reply"] = "<think>let me see</think> The answer"
    body = {"model": "thinker", "prompt": "why", "think": True, "stream": False}
    r = client.post("/api/generate", json=body).json()
    assert r["thinking"] == "let me see" and r["response"] == "The answer"
    said = starter.runners[0].prompts[0] + "<think>let me see</think> The answer"
    assert r["context"] == list(range(len(said.split())))  # the fake: a token a word


def test_tool_calls_are_parsed_with_ids(client, starter):
    call = '<tool_call> {"name": "get_weather", "arguments": {"location": "Paris"}} </tool_call>'
    starter.runner_args["reply"] = call
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    r = chat(client, model="tooly", stream=False, tools=tools)
    message = r.json()["message"]
    assert message["content"] == ""
    [parsed] = message["tool_calls"]
    arguments = {"location": "Paris"}
    assert parsed["function"] == {"index": 0, "name": "get_weather", "arguments": arguments}
    assert parsed["id"].startswith("call_")
    assert "<tools>1</tools>" in starter.runners[0].prompts[0]


def test_history_that_does_not_fit_is_truncated(client, starter):
    messages = [{"role": "user", "content": "word " * 50}, {"role": "assistant", "content": "ok"}]
    messages.append({"role": "user", "content": "last"})
    r = chat(client, stream=False, messages=messages, options={"num_ctx": 20})
    assert r.json()["truncated"] is True
    assert "word" not in starter.runners[0].prompts[0]


def test_embed_of_no_input_answers_the_model_and_an_empty_list(client):
    for body in ({"model": "fake"}, {"model": "fake", "input": []}, {"model": "fake", "input": ""}):
        assert client.post("/api/embed", json=body).json() == {"model": "fake", "embeddings": []}


def test_embeddings_are_written_as_go_writes_float32():
    from ember.server.embedding import normalize

    vector = normalize([0.3, -0.12556877331945932, 1e-9, 5.0])
    assert json.dumps(vector) == "[0.05987348, -0.025060799, 1.9957827e-10, 0.99789137]"


def test_embed_sends_the_runner_the_num_ctx_an_input_is_cut_to(client, starter):
    client.post("/api/embed", json={"model": "fake", "input": "ab", "options": {"num_ctx": 2}})
    assert starter.runners[0].cut_to == 2  # below the 4 the runner is loaded with


def test_embed_normalises_and_cuts_dimensions(client):
    r = client.post("/api/embed", json={"model": "fake", "input": ["ab", "abcd"]})
    body = r.json()
    assert len(body["embeddings"]) == 2 and body["prompt_eval_count"] == 2
    for v in body["embeddings"]:
        assert sum(x * x for x in v) == pytest.approx(1.0)
    r = client.post("/api/embed", json={"model": "fake", "input": "ab", "dimensions": 2})
    assert r.json()["embeddings"] == [[1.0, 0.0]]
    r = client.post("/api/embed", json={"model": "fake", "input": []})
    assert r.json()["embeddings"] == []
    (whole,) = client.post("/api/embed", json={"model": "fake", "input": "ab"}).json()["embeddings"]
    for dimensions in (0, -1, len(whole), 99):  # as Ollama's: only 1 to the length - 1 cut
        body = {"model": "fake", "input": "ab", "dimensions": dimensions}
        assert client.post("/api/embed", json=body).json()["embeddings"] == [whole]
    r = client.post("/api/embed", json={"model": "fake", "input": ["ab", ""]})
    assert len(r.json()["embeddings"]) == 2  # "" is an input in a list (alone: none)


def test_a_decoders_legacy_embeddings_are_not_normalised(client):
    r = client.post("/api/embeddings", json={"model": "fake", "prompt": "abc"})
    assert r.json() == {"embedding": [3.0, 0.0, 3.0, 4.0]}
    assert client.post("/api/embeddings", json={"model": "fake"}).json() == {"embedding": []}


def test_unknown_routes_are_json_404(client):
    r = client.get("/api/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_a_wrong_method_is_405_with_allow(client):
    r = client.get("/api/chat")
    assert r.status_code == 405 and "error" in r.json()
    assert r.headers["allow"] == "POST"  # as gin sends it


def test_debug_render_only_answers_the_prompt_without_generating(client, starter):
    r = client.post(
        "/api/generate",
        json={"model": "fake", "prompt": "why", "_debug_render_only": True},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["_debug_info"] == {"rendered_template": "<user>why</user>\n<assistant>"}
    assert body["done"] is False and body["response"] == ""
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/api/chat", json=chat | {"_debug_render_only": True, "stream": False})
    assert r.json()["_debug_info"] == {"rendered_template": "<user>hi</user>\n<assistant>"}
    assert r.json()["message"] == {"role": "", "content": ""}
    assert all(not r.prompts for r in starter.runners)  # nothing was generated


def test_a_requests_go_template_renders_its_prompt_and_a_bad_one_is_400(client):
    body = {"model": "fake", "prompt": "why", "system": "S", "_debug_render_only": True}
    template = "{{ if .System }}({{ .System }}) {{ end }}Q: {{ .Prompt }} A:"
    r = client.post("/api/generate", json=body | {"template": template})
    assert r.json()["_debug_info"]["rendered_template"] == "(S) Q: why A:"
    r = client.post("/api/generate", json=body | {"template": "{{ .Prompt "})
    assert r.status_code == 400
    assert r.json() == {"error": "the Go template does not parse: unclosed action"}
    r = client.post("/api/generate", json=body | {"template": "{{ .Prompt | nosuch }}"})
    assert r.status_code == 400 and '"nosuch" not defined' in r.json()["error"]


@pytest.mark.parametrize(("think", "rendered"), [(None, "T true"), (False, "F true")])
def test_a_thinking_model_asked_nothing_of_think_thinks(client, think, rendered):
    """As Ollama's handlers set think=true for a thinking model: a Go template's .Think had
    read false, so the model was told not to think while the parser waited for thinking."""
    template = "{{ if .Think }}T{{ else }}F{{ end }} {{ .IsThinkSet }}"
    body = {"model": "thinker", "prompt": "why", "template": template, "_debug_render_only": True}
    r = client.post("/api/generate", json=body | ({} if think is None else {"think": think}))
    assert r.json()["_debug_info"]["rendered_template"] == rendered


def test_ps_lists_the_latest_to_expire_first(client):
    """As Ollama's PsHandler (and so `ollama ps`): ordered by expires_at, latest first."""
    for name, keep_alive in (("fake", "5m"), ("tooly", "1h"), ("other", "10m")):
        body = {"model": name, "stream": False, "keep_alive": keep_alive}
        assert client.post("/api/generate", json=body).json()["done_reason"] == "load"
    ps = client.get("/api/ps").json()["models"]
    assert [m["name"] for m in ps] == ["tooly", "other", "fake"]
