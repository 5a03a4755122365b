"""/v1 over fake runners: OpenAI's objects, SSE streams with usage, tool calls and tool_choice,
response_format, embeddings (float and base64), models, and OpenAI's error object."""

import base64
import json
import struct
from typing import Any

import pytest
from fastapi.testclient import TestClient


def events(response: Any) -> list[Any]:
    data = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def completion(client: TestClient, **body: Any) -> Any:
    body.setdefault("model", "fake")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return client.post("/v1/chat/completions", json=body)


def test_chat_completion_object(client, starter):
    r = completion(client, max_tokens=2, seed=3)
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello there"}
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2
    options = starter.runners[0].fields[0]["options"]
    assert (options["temperature"], options["top_p"], options["seed"]) == (1.0, 1.0, 3)


@pytest.mark.parametrize("stream", [False, True])
def test_debug_render_only_answers_the_prompt_on_v1(client, starter, stream):
    # as Ollama's middleware passes `_debug_render_only` through: one object, nothing generated
    r = completion(client, stream=stream, _debug_render_only=True)
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["_debug_info"] == {"rendered_template": "<user>hi</user>\n<assistant>"}
    assert body["choices"][0]["finish_reason"] is None
    assert body["choices"][0]["message"]["content"] == ""
    r = client.post(
        "/v1/completions", json={"model": "fake", "prompt": "why", "_debug_render_only": True}
    )
    assert r.json()["_debug_info"] == {"rendered_template": "<user>why</user>\n<assistant>"}
    assert r.json()["choices"][0]["text"] == ""
    assert all(not r.prompts for r in starter.runners)


@pytest.mark.parametrize(
    ("seed", "seeds"),
    [
        (3, [3, 4, 5]),
        (-1, [-1, -1, -1]),
        (-3, [-3, -2, 0]),
        (2**63 - 1, [2**63 - 1, -(2**63), -(2**63) + 1]),
    ],
)
def test_n_choices_take_seed_plus_i_skipping_random_and_wrapping(client, starter, seed, seeds):
    # -1 is random for every choice; no choice's seed is -1 or past an int64
    completion(client, max_tokens=1, seed=seed, n=3)
    assert sorted(f["options"]["seed"] for f in starter.runners[0].fields) == sorted(seeds)


def test_a_developer_message_is_a_system_one(client, starter):
    """OpenAI's newer name for system, as /v1/responses takes it (a template knows system)."""
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Q"}]
    assert completion(client, messages=messages).status_code == 200
    assert starter.runners[0].prompts[0] == (
        "<system>Be brief.</system>\n<user>Q</user>\n<assistant>"
    )


def test_chat_stream_with_usage(client):
    r = completion(client, stream=True, stream_options={"include_usage": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content", "") for d in deltas) == "Hello there friend"
    # OpenAI's layout (Ollama's too): the role first only, the end an empty delta
    assert [d.get("role") for d in deltas] == ["assistant"] + [None] * (len(deltas) - 1)
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = events(completion(client, stream=True))
    assert all(c["choices"] for c in chunks) and "usage" not in chunks[-1]


def test_n_choices_streamed_each_with_its_index_and_one_usage(client):
    chunks = events(completion(client, stream=True, n=3, stream_options={"include_usage": True}))
    texts, finished = ["", "", ""], [None, None, None]
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "")
        finished[choice["index"]] = choice["finish_reason"] or finished[choice["index"]]
    assert texts == ["Hello there friend"] * 3 and finished == ["stop"] * 3
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9


def test_an_error_in_one_of_n_streamed_choices_ends_the_stream_with_it(client, starter):
    completion(client)  # loads the runner
    starter.runners[0].error = "boom"
    data = [line[6:] for line in completion(client, stream=True, n=2).text.split("\n\n") if line]
    assert json.loads(data[-1])["error"]["message"] == "boom"  # the last event, as Ollama's


def test_tool_calls_and_tool_choice(client, starter):
    starter.runner_args["reply"] = '<tool_call> {"name": "f", "arguments": {"x": 1}} </tool_call>'
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {}}},
        {"type": "function", "function": {"name": "g", "parameters": {}}},
    ]
    body = completion(client, model="tooly", tools=tools).json()
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "f", "arguments": '{"x":1}'}  # as json.Marshal
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert "<tools>2</tools>" in starter.runners[0].prompts[-1]
    choice = {"type": "function", "function": {"name": "g"}}
    completion(client, model="tooly", tools=tools, tool_choice=choice)
    assert "<tools>1</tools>" in starter.runners[0].prompts[-1]
    completion(client, model="tooly", tools=tools, tool_choice="none")
    assert "<tools>" not in starter.runners[0].prompts[-1]
    r = completion(client, model="tooly", tools=tools, tool_choice={"function": {"name": "h"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_tool_choices_other_forms(client, starter):
    """OpenAI's allowed_tools keeps the tools it lists under its mode; a function named the
    Responses API's way is taken too; an unknown type is a 400 naming it (it had been read as a
    function named None)."""
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {}}},
        {"type": "function", "function": {"name": "g", "parameters": {}}},
    ]
    for mode in ("auto", "required"):
        allowed = {"mode": mode, "tools": [{"type": "function", "function": {"name": "g"}}]}
        choice = {"type": "allowed_tools", "allowed_tools": allowed}
        assert completion(client, model="tooly", tools=tools, tool_choice=choice).status_code == 200
        assert "<tools>1</tools>" in starter.runners[0].prompts[-1]
    choice = {"type": "function", "name": "g"}
    assert completion(client, model="tooly", tools=tools, tool_choice=choice).status_code == 200
    assert "<tools>1</tools>" in starter.runners[0].prompts[-1]
    for choice, message in [
        ({"type": "custom", "custom": {"name": "f"}}, "tool_choice of type 'custom'"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"name": "h"}]}},
         "unknown function 'h'"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "any", "tools": []}}, "mode"),
    ]:  # fmt: skip
        r = completion(client, model="tooly", tools=tools, tool_choice=choice)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_response_format_becomes_the_format(client, starter):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    completion(client, response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    assert starter.runners[0].fields[-1]["format"] == schema
    completion(client, response_format={"type": "json_object"})
    assert starter.runners[0].fields[-1]["format"] == "json"
    r = completion(client, response_format={"type": "json_schema"})  # no schema: as OpenAI's
    assert r.status_code == 400 and "needs its json_schema" in r.json()["error"]["message"]


def test_errors_use_openai_error_objects(client):
    r = completion(client, model="nope")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    r = completion(client, messages="x")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.post("/v1/chat/completions", content=b"{")
    assert r.status_code == 400 and "message" in r.json()["error"]
    # no messages is a 400 before any load, as Ollama's middleware
    for empty in ({"messages": []}, {}):
        r = client.post("/v1/chat/completions", json={"model": "fake"} | empty)
        assert r.status_code == 400, empty
        assert r.json()["error"]["message"] == "[] is too short - 'messages'"


def test_completions(client, starter):
    body = client.post("/v1/completions", json={"model": "fake", "prompt": "say"}).json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hello there friend"
    streamed = {"model": "fake", "prompt": "x", "stream": True}
    chunks = events(client.post("/v1/completions", json=streamed))
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello there friend"
    with_logprobs = {"model": "fake", "prompt": "x", "logprobs": 1}
    body = client.post("/v1/completions", json=with_logprobs).json()
    assert body["choices"][0]["logprobs"]["tokens"] == ["Hello", "there", "friend"]


def test_embeddings_float_and_base64(client):
    r = client.post("/v1/embeddings", json={"model": "fake", "input": ["ab", "c"]})
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    vector = body["data"][0]["embedding"]
    r = client.post(
        "/v1/embeddings", json={"model": "fake", "input": "ab", "encoding_format": "base64"}
    )
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(vector)
    r = client.post("/v1/embeddings", json={"model": "fake", "input": []})
    assert r.status_code == 400


def test_an_empty_string_is_one_input_as_in_ollamas_middleware(client):
    r = client.post("/v1/embeddings", json={"model": "fake", "input": ""})
    assert r.status_code == 200 and len(r.json()["data"]) == 1
    r = client.post("/v1/embeddings", json={"model": "fake", "input": ["a", ""]})
    assert r.status_code == 200 and len(r.json()["data"]) == 2


def test_models(client):
    data = client.get("/v1/models").json()["data"]
    assert {m["id"] for m in data} >= {"fake", "tooly"}
    assert client.get("/v1/models/fake").json()["owned_by"] == "library"
    assert client.get("/v1/models/nope").status_code == 404


def test_calls_relabel_only_a_stop_as_ollamas_finish_chunk():
    from ember.server.openai import _finish_reason

    assert _finish_reason({"done_reason": "stop"}, True) == "tool_calls"
    assert _finish_reason({"done_reason": "length"}, True) == "length"  # a call cut short
    assert _finish_reason({"done_reason": "length"}, False) == "length"
    assert _finish_reason({"done_reason": "stop"}, False) == "stop"
